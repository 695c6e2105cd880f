// apply_op: a recorded op run again through its Tensor op or Context collective.
#include "runtime/detail/op_apply.h"

#include <string>

#include "core/error.h"
#include "core/strings.h"
#include "runtime/context.h"
#include "runtime/tensor_ops.h"

namespace meshrt::detail {

namespace {

CollectiveOptions options_of(const CollectiveHow& how) {
  CollectiveOptions o;
  o.algo = static_cast<CollectiveAlgo>(how.algo);
  o.deterministic = how.deterministic;
  return o;
}

AxisNames axes_of(const std::vector<std::string>& axes) { return AxisNames(axes); }

Scalar scalar_of(const ScalarAttrs& a) {
  Scalar s(a.value);
  s.integral = a.integral;
  return s;
}

[[noreturn]] void throw_no_tensor_form(OpId op) {
  throw Error(cat("[jit] internal: the op '", op_name(op),
                  "' has no Tensor form to replay in a shard_map body"));
}

}  // namespace

std::vector<Tensor> apply_op(OpId op, std::span<const Tensor> in, const OpAttrs& attrs,
                             std::span<const ResultMeta> outs, Context* body) {
  if (op_def(op).collective && body == nullptr) {
    throw Error(cat("[jit] internal: the collective '", op_name(op), "' outside a body"));
  }
  auto one = [](Tensor t) { return std::vector<Tensor>{std::move(t)}; };
  auto scalar = [&] { return scalar_of(std::get<ScalarAttrs>(attrs)); };
  auto reduce = [&] { return std::get<ReduceAttrs>(attrs); };
  auto matmul_options = [&] {
    MatmulOptions o;
    o.precision = std::get<MatmulAttrs>(attrs).precision;
    return o;
  };
  switch (op) {
    case OpId::add:
      return one(add(in[0], in[1]));
    case OpId::subtract:
      return one(subtract(in[0], in[1]));
    case OpId::multiply:
      return one(multiply(in[0], in[1]));
    case OpId::divide:
      return one(divide(in[0], in[1]));
    case OpId::maximum:
      return one(maximum(in[0], in[1]));
    case OpId::minimum:
      return one(minimum(in[0], in[1]));
    case OpId::equal:
      return one(equal(in[0], in[1]));
    case OpId::not_equal:
      return one(not_equal(in[0], in[1]));
    case OpId::less:
      return one(less(in[0], in[1]));
    case OpId::less_equal:
      return one(less_equal(in[0], in[1]));
    case OpId::greater:
      return one(greater(in[0], in[1]));
    case OpId::greater_equal:
      return one(greater_equal(in[0], in[1]));
    case OpId::where:
      return one(where(in[0], in[1], in[2]));
    case OpId::neg:
      return one(neg(in[0]));
    case OpId::exp:
      return one(exp(in[0]));
    case OpId::log:
      return one(log(in[0]));
    case OpId::sin:
      return one(sin(in[0]));
    case OpId::cos:
      return one(cos(in[0]));
    case OpId::tanh:
      return one(tanh(in[0]));
    case OpId::sqrt:
      return one(sqrt(in[0]));
    case OpId::relu:
      return one(relu(in[0]));
    case OpId::astype:
      return one(astype(in[0], outs[0].dtype));
    case OpId::identity:
      return one(in[0]);
    case OpId::add_scalar:
      return one(add(in[0], scalar()));
    case OpId::sub_scalar:
      return one(subtract(in[0], scalar()));
    case OpId::rsub_scalar:
      return one(subtract(scalar(), in[0]));
    case OpId::mul_scalar:
      return one(multiply(in[0], scalar()));
    case OpId::div_scalar:
      return one(divide(in[0], scalar()));
    case OpId::rdiv_scalar:
      return one(divide(scalar(), in[0]));
    case OpId::max_scalar:
      return one(maximum(in[0], scalar()));
    case OpId::min_scalar:
      return one(minimum(in[0], scalar()));
    case OpId::equal_scalar:
      return one(equal(in[0], scalar()));
    case OpId::not_equal_scalar:
      return one(not_equal(in[0], scalar()));
    case OpId::less_scalar:
      return one(less(in[0], scalar()));
    case OpId::less_equal_scalar:
      return one(less_equal(in[0], scalar()));
    case OpId::greater_scalar:
      return one(greater(in[0], scalar()));
    case OpId::greater_equal_scalar:
      return one(greater_equal(in[0], scalar()));
    case OpId::sum:
      return one(sum(in[0], reduce().axis, reduce().keepdims));
    case OpId::mean:
      return one(mean(in[0], reduce().axis, reduce().keepdims));
    case OpId::max:
      return one(max(in[0], reduce().axis, reduce().keepdims));
    case OpId::min:
      return one(min(in[0], reduce().axis, reduce().keepdims));
    case OpId::argmax:
      return one(argmax(in[0], reduce().axis, reduce().keepdims));
    case OpId::softmax:
      return one(softmax(in[0], std::get<AxisAttrs>(attrs).axis));
    case OpId::log_softmax:
      return one(log_softmax(in[0], std::get<AxisAttrs>(attrs).axis));
    case OpId::matmul:
      return one(matmul(in[0], in[1], matmul_options()));
    case OpId::matmul_transposed: {
      const MatmulAttrs& m = std::get<MatmulAttrs>(attrs);
      return one(matmul_transposed(in[0], in[1], m.transpose_a, m.transpose_b, matmul_options()));
    }
    case OpId::transpose: {
      const std::vector<int64_t>& p = std::get<PermAttrs>(attrs).perm;
      return one(transpose(in[0], std::vector<int>(p.begin(), p.end())));
    }
    case OpId::reshape:
      return one(reshape(in[0], outs[0].shape));
    case OpId::slice: {
      const SliceAttrs& s = std::get<SliceAttrs>(attrs);
      return one(slice(in[0], s.start, s.limit, s.strides));
    }
    case OpId::pad: {
      const PadAttrs& p = std::get<PadAttrs>(attrs);
      return one(pad(in[0], p.widths, p.value));
    }
    case OpId::concatenate:
      return one(
          concatenate(std::vector<Tensor>(in.begin(), in.end()), std::get<AxisAttrs>(attrs).axis));
    case OpId::stack:
      return one(stack(std::vector<Tensor>(in.begin(), in.end()), std::get<AxisAttrs>(attrs).axis));
    case OpId::split:
      return split(in[0], static_cast<int64_t>(outs.size()), std::get<AxisAttrs>(attrs).axis);
    case OpId::row:
      return one(row(in[0], std::get<RowAttrs>(attrs).index));
    case OpId::dynamic_update_slice:
      return one(dynamic_update_slice(in[0], in[1], std::get<UpdateSliceAttrs>(attrs).starts));
    case OpId::psum:
    case OpId::pmean:
    case OpId::pmax:
    case OpId::pmin: {
      const CollectiveAttrs& c = std::get<CollectiveAttrs>(attrs);
      const AxisNames axes = axes_of(c.axes);
      const CollectiveOptions o = options_of(c.how);
      if (op == OpId::psum) return one(body->psum(in[0], axes, o));
      if (op == OpId::pmean) return one(body->pmean(in[0], axes, o));
      if (op == OpId::pmax) return one(body->pmax(in[0], axes, o));
      return one(body->pmin(in[0], axes, o));
    }
    case OpId::all_gather: {
      const GatherAttrs& g = std::get<GatherAttrs>(attrs);
      return one(body->all_gather(in[0], axes_of(g.axes), g.axis, g.tiled, options_of(g.how)));
    }
    case OpId::psum_scatter: {
      const GatherAttrs& g = std::get<GatherAttrs>(attrs);
      return one(body->psum_scatter(in[0], axes_of(g.axes), g.axis, g.tiled, options_of(g.how)));
    }
    case OpId::ppermute: {
      const PpermuteAttrs& p = std::get<PpermuteAttrs>(attrs);
      return one(body->ppermute(in[0], axes_of(p.axes), p.perm));
    }
    case OpId::all_to_all: {
      const AllToAllAttrs& a = std::get<AllToAllAttrs>(attrs);
      return one(body->all_to_all(in[0], axes_of(a.axes), a.split_axis, a.concat_axis, a.tiled,
                                  options_of(a.how)));
    }
    case OpId::with_sharding_constraint:
    case OpId::device_put:
    case OpId::shard_map:
      throw_no_tensor_form(op);
  }
  throw_no_tensor_form(op);
}

}  // namespace meshrt::detail
