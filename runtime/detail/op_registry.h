// runtime/detail/op_registry.h: one definition per op (not installed), as JAX's and MLX's
// Primitive.
//
// Every op the dispatch reports (detail::Traced) has an OpId and one OpDef in the table in
// op_registry.cpp: its name (for printing and errors only), its attributes (one struct per
// attribute kind in OpAttrs, not a positional bag), its shape rule, its placement rule family and
// whether it keeps pending sums (global/rules.cpp), its derivative decision (a rule in
// autodiff/rules.cpp, or an explicit "none, as JAX"), whether it is a collective, and the backend
// kernel it runs. The layers above look ops up by OpId; a new op is one enum entry, one table
// row, and the pieces its row promises (tests/test_op_registry.cpp walks the table and checks
// that they exist).
//
// The shape rules shared by the Tensor ops, the Array ops and the placement rules live here too
// (broadcasting, jnp.matmul's shapes, reductions, axis normalisation, transpose, slice, pad,
// reshape, concatenate/stack, split): written once; the first three with one error text, the
// others with each form's wording.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "backends/op_codes.h"
#include "core/dtype.h"

namespace meshrt::detail {

// Every op reported to tracers. shard_map is not reported (it offers itself whole) but names the
// tape's node for it.
enum class OpId : uint8_t {
  // elementwise on two operands (broadcasting)
  add,
  subtract,
  multiply,
  divide,
  maximum,
  minimum,
  equal,
  not_equal,
  less,
  less_equal,
  greater,
  greater_equal,
  where,
  // elementwise on one operand
  neg,
  exp,
  log,
  sin,
  cos,
  tanh,
  sqrt,
  relu,
  astype,
  identity,
  // with a weakly typed scalar (ScalarAttrs)
  add_scalar,
  sub_scalar,
  rsub_scalar,
  mul_scalar,
  div_scalar,
  rdiv_scalar,
  max_scalar,
  min_scalar,
  equal_scalar,
  not_equal_scalar,
  less_scalar,
  less_equal_scalar,
  greater_scalar,
  greater_equal_scalar,
  // reductions and normalisations
  sum,
  mean,
  max,
  min,
  argmax,
  softmax,
  log_softmax,
  // linear algebra
  matmul,
  matmul_transposed,
  transpose,
  // shape
  reshape,
  slice,
  pad,
  concatenate,
  stack,
  split,
  row,
  dynamic_update_slice,
  // placement (Arrays)
  with_sharding_constraint,
  device_put,
  // collectives (Tensors in shard_map bodies)
  psum,
  pmean,
  pmax,
  pmin,
  all_gather,
  psum_scatter,
  ppermute,
  all_to_all,
  // a differentiated shard_map (the tape's node; never reported)
  shard_map,
};
inline constexpr size_t kOpCount = static_cast<size_t>(OpId::shard_map) + 1;

// ---- attributes: one struct per kind; an op names the kind it carries (OpDef::attrs)
struct NoAttrs {
  bool operator==(const NoAttrs&) const = default;
};
// Doubles of attributes compare by their bits (-0.0 and +0.0 give different results).
inline bool same_bits(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}
struct ScalarAttrs {  // the scalar operand of a *_scalar op
  double value = 0.0;
  bool integral = false;  // a weak integer (Scalar::integral), else a weak float
  bool operator==(const ScalarAttrs& o) const {
    return same_bits(value, o.value) && integral == o.integral;
  }
};
struct ReduceAttrs {
  std::optional<int> axis;  // nullopt: every dimension
  bool keepdims = false;
  bool operator==(const ReduceAttrs&) const = default;
};
struct AxisAttrs {  // softmax, log_softmax, concatenate, stack, split
  int axis = 0;
  bool operator==(const AxisAttrs&) const = default;
};
struct MatmulAttrs {  // the backward products use the forward product's precision
  bool transpose_a = false, transpose_b = false;
  Precision precision = Precision::highest;
  bool operator==(const MatmulAttrs&) const = default;
};
struct PermAttrs {
  std::vector<int64_t> perm;
  bool operator==(const PermAttrs&) const = default;
};
struct SliceAttrs {
  Shape start, limit, strides;  // strides always given (1 where the call gave none)
  bool operator==(const SliceAttrs&) const = default;
};
struct PadAttrs {
  std::vector<std::pair<int64_t, int64_t>> widths;
  double value = 0.0;  // what the padding holds
  bool operator==(const PadAttrs& o) const {
    return widths == o.widths && same_bits(value, o.value);
  }
};
struct RowAttrs {
  int64_t index = 0;  // non-negative
  bool operator==(const RowAttrs&) const = default;
};
struct UpdateSliceAttrs {
  Shape starts;  // after clamping
  bool operator==(const UpdateSliceAttrs&) const = default;
};
// A collective call's CollectiveOptions (runtime/context.h), kept so that jit replays the call
// as it ran: `algo` is the CollectiveAlgo's value.
struct CollectiveHow {
  uint8_t algo = 0;
  bool deterministic = false;
  bool operator==(const CollectiveHow&) const = default;
};
struct CollectiveAttrs {  // psum, pmean, pmax, pmin
  std::vector<std::string> axes;
  CollectiveHow how = {};
  bool operator==(const CollectiveAttrs&) const = default;
};
struct GatherAttrs {  // all_gather (axis: where the gathered dim goes), psum_scatter (its dim)
  std::vector<std::string> axes;
  int axis = 0;
  bool tiled = false;
  CollectiveHow how = {};
  bool operator==(const GatherAttrs&) const = default;
};
struct PpermuteAttrs {
  std::vector<std::string> axes;
  std::vector<std::pair<int64_t, int64_t>> perm;  // (source, destination)
  bool operator==(const PpermuteAttrs&) const = default;
};
struct AllToAllAttrs {
  std::vector<std::string> axes;
  int split_axis = 0, concat_axis = 0;
  bool tiled = false;
  CollectiveHow how = {};
  bool operator==(const AllToAllAttrs&) const = default;
};
using OpAttrs = std::variant<NoAttrs, ScalarAttrs, ReduceAttrs, AxisAttrs, MatmulAttrs, PermAttrs,
                             SliceAttrs, PadAttrs, RowAttrs, UpdateSliceAttrs, CollectiveAttrs,
                             GatherAttrs, PpermuteAttrs, AllToAllAttrs>;

// A collective's mesh axes (empty for other ops).
const std::vector<std::string>& collective_axes(const OpAttrs& attrs);

// ---- the table's columns
// The shape rule: how the result's shape and dtype follow from the operands'.
enum class ShapeRule : uint8_t {
  unset,       // never in the table (the registry test fails on it)
  broadcast,   // broadcast_shapes; dtype promoted (comparisons: bool)
  same,        // the operand's shape; dtype kept or made float
  reduce,      // reduce_shape
  matmul,      // matmul_shape
  permute,     // the operand's dims in PermAttrs order
  reshape,     // the requested shape, same element count
  slice,       // SliceAttrs' (limit - start) / stride per dim
  pad,         // each dim grown by its widths
  join,        // concatenate: dims summed along the axis; stack: a new dim
  split,       // equal parts along the axis
  row,         // the leading dim dropped
  collective,  // given by the axes' sizes (all_gather grows, psum_scatter shrinks, ...)
};
// The placement rule (global/rules.cpp) of the op's Array form.
enum class Placement : uint8_t {
  unset,        // never in the table
  elementwise,  // elementwise_rule
  reduce,       // reduce_rule
  gather_dims,  // gather_dims_rule
  matmul,       // matmul_rule
  transpose,    // transpose_rule
  reshape,      // reshape_rule
  join,         // join_rule
  resharding,   // the op is a change of placement itself (device_put, with_sharding_constraint)
  passthrough,  // no launch: the value is passed on as it is (identity)
  body_only,    // no Array form: a collective, in shard_map bodies
  tensor_only,  // no Array form of its own (x[i] on Arrays is a slice and a reshape)
};
// What reverse mode does with the op.
enum class Derivative : uint8_t {
  unset,     // never in the table
  rule,      // autodiff/rules.cpp has a rule for each form the op has (Tensor, Array)
  zero,      // bool or integer results: never followed, a zero gradient (as JAX)
  none,      // not differentiable, as in JAX (an error when a differentiated value reaches it)
  pullback,  // shard_map: its node carries a pullback instead of a rule
};
// The backend kernel the Tensor op runs (composite ops run other ops' kernels).
using Kernel = std::variant<std::monostate, backend::UnaryOp, backend::BinaryOp, backend::ReduceOp,
                            backend::FoldOp>;

struct OpDef {
  OpId id;
  std::string_view name;  // printing and errors only: nothing looks an op up by it
  size_t attrs;           // OpAttrs' alternative the op carries (its variant index)
  ShapeRule shape;
  Placement placement;
  bool linear;  // keeps a pending sum when its operands carry the same one
  Derivative derivative;
  bool on_tensor, on_array;  // which forms report it
  bool collective;           // a collective over mesh axes (shard_map bodies)
  bool reduces_axes;         // a collective whose result no longer varies over its axes
  Kernel kernel;
};

// The op's definition; every OpId has one.
const OpDef& op_def(OpId id);
inline std::string_view op_name(OpId id) { return op_def(id).name; }
// Every definition, in OpId order.
std::span<const OpDef> op_defs();

// Whether `rule` is written once below, as a function every form of its ops calls: a shape rule
// is written where the op is only when the op has one form (row, the collectives) or when there
// is nothing to check (same). tests/test_op_registry.cpp requires it of every op with both a
// Tensor and an Array form.
bool shape_rule_shared(ShapeRule rule);

// ---- shared shape rules. `where` starts each error ("[ops] add: ", "[add] ").
// NumPy broadcasting of any number of shapes.
Shape broadcast_shapes(std::span<const Shape> shapes, std::string_view where);
inline Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view where) {
  const Shape both[] = {a, b};
  return broadcast_shapes(both, where);
}
// jnp.matmul of a (..., m, k) and b (..., k, n), an operand read with its last two dims swapped
// where ta/tb; 1-D operands promoted and their added dim removed from the result.
struct MatmulShape {
  Shape batch;  // the broadcast batch dims
  int64_t m = 1, k = 1, n = 1;
  Shape out;  // the result's shape
};
MatmulShape matmul_shape(const Shape& a, const Shape& b, bool ta, bool tb, std::string_view op,
                         std::string_view where);
// A reduction over `axis` (normalised, or nullopt for all): the result's shape.
Shape reduce_shape(const Shape& x, std::optional<int> axis, bool keepdims);

// The rules below check the same things for both forms but keep each form's wording (the Tensor
// ops' "[ops] slice: ...", the Array ops' "[slice] ..."): `form` says which text an error takes.
enum class Form : uint8_t { tensor, array };
// `axis` against `rank` as JAX normalises it (negative counts from the end); `x` is the operand's
// shape (rank may exceed its rank by one: stack, expand_dims). Out of range: the Tensor ops'
// "[ops] op: axis 2 is out of bounds for an array of shape (2, 3) (rank 2)", or JAX's text
// "[op] axis 2 is out of bounds for array of dimension 2" (the Array ops and the collectives).
int normalize_axis(int64_t axis, int64_t rank, std::string_view op, const Shape& x, Form form);
// jnp.transpose: `perm` (empty: the dims reversed) normalised in place and checked to be a
// permutation of x's dims; the result's shape.
Shape permute_shape(const Shape& x, std::vector<int>& perm, Form form);
// lax.slice of `x` from start to limit (exclusive) by strides (empty: 1 in every dim).
Shape slice_shape(const Shape& x, const Shape& start, const Shape& limit, const Shape& strides,
                  Form form);
// jnp.pad by (before, after) widths per dim.
Shape pad_shape(const Shape& x, std::span<const std::pair<int64_t, int64_t>> widths, Form form);
// `shape` with its -1 (at most one) inferred; the element count must stay. `op` names the call
// in the Array form's errors (reshape, squeeze, expand_dims, row).
Shape reshape_shape(const Shape& x, Shape shape, std::string_view op, Form form);
// concatenate (dims summed along `axis`) or stack (a new dim at `axis`) of `xs` (at least one);
// `axis` is normalised (for stack, against the result's rank).
Shape join_shape(std::span<const Shape> xs, int axis, bool stack, Form form);
// jnp.split of `x` into `sections` equal parts along `axis` (normalised): each part's shape.
Shape split_shape(const Shape& x, int64_t sections, int axis, Form form);

}  // namespace meshrt::detail
