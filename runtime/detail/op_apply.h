// runtime/detail/op_apply.h: an op run again from what a tracer recorded of it (not installed).
//
// A tracer sees each op as its OpId, operands, results and attributes (runtime/detail/trace.h).
// apply_op runs the op again on new operands through the same Tensor op (or Context collective),
// so that it gives the bits the recorded call would give them: jit replays a shard_map body's
// recorded ops with it (global/jit_record.cpp). The attributes carry everything the call took
// (a scalar's weak type, pad's value, a collective's options); the recorded results' shapes and
// dtypes give what an op takes as its result's (reshape's shape, astype's dtype).
#pragma once

#include <span>
#include <vector>

#include "core/dtype.h"
#include "runtime/detail/op_registry.h"
#include "runtime/tensor.h"

namespace meshrt {
class Context;
}

namespace meshrt::detail {

// A recorded result's shape and dtype.
struct ResultMeta {
  Shape shape;
  DType dtype = DType::f32;
};

// Runs `op` on `ins` with `attrs`; `outs` are the recorded results' shapes and dtypes (one per
// result); `ctx` is the body's context (collectives; null where the ops run outside a body, as
// when the kernel tape records them: a collective is then an internal Error). Ops with no Tensor
// form (the placement ops, a differentiated shard_map's node) are an internal Error.
std::vector<Tensor> apply_op(OpId op, std::span<const Tensor> ins, const OpAttrs& attrs,
                             std::span<const ResultMeta> outs, Context* ctx);

}  // namespace meshrt::detail
