// The op table, and the shape rules the Tensor ops, the Array ops and the placement rules share.
#include "runtime/detail/op_registry.h"

#include <algorithm>
#include <array>
#include <type_traits>

#include "core/error.h"
#include "core/strings.h"

namespace meshrt::detail {
namespace {

using backend::BinaryOp;
using backend::FoldOp;
using backend::ReduceOp;
using backend::UnaryOp;

// OpAttrs' alternative index of T.
template <class T, class V>
struct AttrsIndex;
template <class T, class... Ts>
struct AttrsIndex<T, std::variant<Ts...>> {
  static constexpr size_t value = [] {
    size_t i = 0;
    bool found = false;
    ((found = found || std::is_same_v<T, Ts>, i += found ? 0 : 1), ...);
    return i;
  }();
};
template <class T>
constexpr size_t kAttrs = AttrsIndex<T, OpAttrs>::value;

constexpr size_t kNo = kAttrs<NoAttrs>, kScalar = kAttrs<ScalarAttrs>,
                 kReduce = kAttrs<ReduceAttrs>, kAxis = kAttrs<AxisAttrs>,
                 kMatmul = kAttrs<MatmulAttrs>, kPerm = kAttrs<PermAttrs>,
                 kSlice = kAttrs<SliceAttrs>, kPad = kAttrs<PadAttrs>, kRow = kAttrs<RowAttrs>,
                 kUpdate = kAttrs<UpdateSliceAttrs>, kColl = kAttrs<CollectiveAttrs>,
                 kGather = kAttrs<GatherAttrs>, kPpermute = kAttrs<PpermuteAttrs>,
                 kAllToAll = kAttrs<AllToAllAttrs>;
static_assert(kAllToAll == std::variant_size_v<OpAttrs> - 1);

using S = ShapeRule;
using P = Placement;
using D = Derivative;
constexpr bool kLinear = true, kNonlinear = false;
enum Forms { kTensor = 1, kArray = 2, kBoth = 3 };

struct Row {
  OpId id;
  std::string_view name;
  size_t attrs;
  ShapeRule shape;
  Placement placement;
  bool linear;
  Derivative derivative;
  Forms forms;
  Kernel kernel;
};

// One row per op, in OpId order (checked below). The Array forms' placement rule families are
// those global/rules.cpp implements; a `rule` derivative is one autodiff/rules.cpp implements.
const Row kRows[] = {
    // ---- elementwise, two operands
    {OpId::add, "add", kNo, S::broadcast, P::elementwise, kLinear, D::rule, kBoth, BinaryOp::add},
    {OpId::subtract, "subtract", kNo, S::broadcast, P::elementwise, kLinear, D::rule, kBoth,
     BinaryOp::sub},
    {OpId::multiply, "multiply", kNo, S::broadcast, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::mul},
    {OpId::divide, "divide", kNo, S::broadcast, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::div},
    {OpId::maximum, "maximum", kNo, S::broadcast, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::max},
    {OpId::minimum, "minimum", kNo, S::broadcast, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::min},
    {OpId::equal, "equal", kNo, S::broadcast, P::elementwise, kNonlinear, D::zero, kBoth,
     BinaryOp::eq},
    {OpId::not_equal, "not_equal", kNo, S::broadcast, P::elementwise, kNonlinear, D::zero, kBoth,
     BinaryOp::ne},
    {OpId::less, "less", kNo, S::broadcast, P::elementwise, kNonlinear, D::zero, kBoth,
     BinaryOp::lt},
    {OpId::less_equal, "less_equal", kNo, S::broadcast, P::elementwise, kNonlinear, D::zero, kBoth,
     BinaryOp::le},
    {OpId::greater, "greater", kNo, S::broadcast, P::elementwise, kNonlinear, D::zero, kBoth,
     BinaryOp::gt},
    {OpId::greater_equal, "greater_equal", kNo, S::broadcast, P::elementwise, kNonlinear, D::zero,
     kBoth, BinaryOp::ge},
    {OpId::where, "where", kNo, S::broadcast, P::elementwise, kNonlinear, D::rule, kBoth, {}},
    // ---- elementwise, one operand
    {OpId::neg, "neg", kNo, S::same, P::elementwise, kLinear, D::rule, kBoth, UnaryOp::neg},
    {OpId::exp, "exp", kNo, S::same, P::elementwise, kNonlinear, D::rule, kBoth, UnaryOp::exp},
    {OpId::log, "log", kNo, S::same, P::elementwise, kNonlinear, D::rule, kBoth, UnaryOp::log},
    {OpId::sin, "sin", kNo, S::same, P::elementwise, kNonlinear, D::rule, kBoth, UnaryOp::sin},
    {OpId::cos, "cos", kNo, S::same, P::elementwise, kNonlinear, D::rule, kBoth, UnaryOp::cos},
    {OpId::tanh, "tanh", kNo, S::same, P::elementwise, kNonlinear, D::rule, kBoth, UnaryOp::tanh},
    {OpId::sqrt, "sqrt", kNo, S::same, P::elementwise, kNonlinear, D::rule, kBoth, UnaryOp::sqrt},
    {OpId::relu, "relu", kNo, S::same, P::elementwise, kNonlinear, D::rule, kBoth, UnaryOp::relu},
    {OpId::astype, "astype", kNo, S::same, P::elementwise, kNonlinear, D::rule, kBoth,
     UnaryOp::copy},
    {OpId::identity, "identity", kNo, S::same, P::passthrough, kLinear, D::rule, kBoth, {}},
    // ---- with a scalar
    {OpId::add_scalar, "add_scalar", kScalar, S::same, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::add},
    {OpId::sub_scalar, "sub_scalar", kScalar, S::same, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::sub},
    {OpId::rsub_scalar, "rsub_scalar", kScalar, S::same, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::sub},
    {OpId::mul_scalar, "mul_scalar", kScalar, S::same, P::elementwise, kLinear, D::rule, kBoth,
     BinaryOp::mul},
    {OpId::div_scalar, "div_scalar", kScalar, S::same, P::elementwise, kLinear, D::rule, kBoth,
     BinaryOp::div},
    {OpId::rdiv_scalar, "rdiv_scalar", kScalar, S::same, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::div},
    {OpId::max_scalar, "max_scalar", kScalar, S::same, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::max},
    {OpId::min_scalar, "min_scalar", kScalar, S::same, P::elementwise, kNonlinear, D::rule, kBoth,
     BinaryOp::min},
    {OpId::equal_scalar, "equal_scalar", kScalar, S::same, P::elementwise, kNonlinear, D::zero,
     kBoth, BinaryOp::eq},
    {OpId::not_equal_scalar, "not_equal_scalar", kScalar, S::same, P::elementwise, kNonlinear,
     D::zero, kBoth, BinaryOp::ne},
    {OpId::less_scalar, "less_scalar", kScalar, S::same, P::elementwise, kNonlinear, D::zero, kBoth,
     BinaryOp::lt},
    {OpId::less_equal_scalar, "less_equal_scalar", kScalar, S::same, P::elementwise, kNonlinear,
     D::zero, kBoth, BinaryOp::le},
    {OpId::greater_scalar, "greater_scalar", kScalar, S::same, P::elementwise, kNonlinear, D::zero,
     kBoth, BinaryOp::gt},
    {OpId::greater_equal_scalar, "greater_equal_scalar", kScalar, S::same, P::elementwise,
     kNonlinear, D::zero, kBoth, BinaryOp::ge},
    // ---- reductions (a Tensor mean is reported as its sum and division)
    {OpId::sum, "sum", kReduce, S::reduce, P::reduce, kLinear, D::rule, kBoth, ReduceOp::sum},
    {OpId::mean, "mean", kReduce, S::reduce, P::reduce, kLinear, D::rule, kArray, {}},
    {OpId::max, "max", kReduce, S::reduce, P::reduce, kNonlinear, D::rule, kBoth, ReduceOp::max},
    {OpId::min, "min", kReduce, S::reduce, P::reduce, kNonlinear, D::rule, kBoth, ReduceOp::min},
    {OpId::argmax, "argmax", kReduce, S::reduce, P::reduce, kNonlinear, D::zero, kBoth,
     ReduceOp::argmax},
    {OpId::softmax, "softmax", kAxis, S::same, P::gather_dims, kNonlinear, D::rule, kBoth, {}},
    {OpId::log_softmax,
     "log_softmax",
     kAxis,
     S::same,
     P::gather_dims,
     kNonlinear,
     D::rule,
     kBoth,
     {}},
    // ---- linear algebra (dot is reported as the matmul it is)
    {OpId::matmul, "matmul", kMatmul, S::matmul, P::matmul, kNonlinear, D::rule, kBoth, {}},
    {OpId::matmul_transposed,
     "matmul_transposed",
     kMatmul,
     S::matmul,
     P::matmul,
     kNonlinear,
     D::rule,
     kBoth,
     {}},
    {OpId::transpose, "transpose", kPerm, S::permute, P::transpose, kLinear, D::rule, kBoth,
     UnaryOp::copy},
    // ---- shape (squeeze and expand_dims are reshapes; Tensor stack and split are made of
    // expand_dims, concatenate and slices)
    {OpId::reshape, "reshape", kNo, S::reshape, P::reshape, kLinear, D::rule, kBoth, {}},
    {OpId::slice, "slice", kSlice, S::slice, P::gather_dims, kNonlinear, D::rule, kBoth,
     UnaryOp::copy},
    {OpId::pad, "pad", kPad, S::pad, P::gather_dims, kNonlinear, D::rule, kBoth, {}},
    {OpId::concatenate, "concatenate", kAxis, S::join, P::join, kNonlinear, D::rule, kBoth, {}},
    {OpId::stack, "stack", kAxis, S::join, P::join, kNonlinear, D::rule, kArray, {}},
    {OpId::split, "split", kAxis, S::split, P::gather_dims, kNonlinear, D::rule, kArray, {}},
    {OpId::row, "row", kRow, S::row, P::tensor_only, kNonlinear, D::rule, kTensor, {}},
    {OpId::dynamic_update_slice,
     "dynamic_update_slice",
     kUpdate,
     S::same,
     P::tensor_only,
     kNonlinear,
     D::rule,
     kTensor,
     {}},
    // ---- placement
    {OpId::with_sharding_constraint,
     "with_sharding_constraint",
     kNo,
     S::same,
     P::resharding,
     kNonlinear,
     D::rule,
     kArray,
     {}},
    {OpId::device_put, "device_put", kNo, S::same, P::resharding, kNonlinear, D::rule, kArray, {}},
    // ---- collectives (pmax/pmin: JAX defines no derivative)
    {OpId::psum, "psum", kColl, S::same, P::body_only, kNonlinear, D::rule, kTensor, FoldOp::sum},
    {OpId::pmean, "pmean", kColl, S::same, P::body_only, kNonlinear, D::rule, kTensor,
     FoldOp::mean},
    {OpId::pmax, "pmax", kColl, S::same, P::body_only, kNonlinear, D::none, kTensor, FoldOp::max},
    {OpId::pmin, "pmin", kColl, S::same, P::body_only, kNonlinear, D::none, kTensor, FoldOp::min},
    {OpId::all_gather,
     "all_gather",
     kGather,
     S::collective,
     P::body_only,
     kNonlinear,
     D::rule,
     kTensor,
     {}},
    {OpId::psum_scatter, "psum_scatter", kGather, S::collective, P::body_only, kNonlinear, D::rule,
     kTensor, FoldOp::sum},
    {OpId::ppermute,
     "ppermute",
     kPpermute,
     S::same,
     P::body_only,
     kNonlinear,
     D::rule,
     kTensor,
     {}},
    {OpId::all_to_all,
     "all_to_all",
     kAllToAll,
     S::collective,
     P::body_only,
     kNonlinear,
     D::rule,
     kTensor,
     {}},
    // ---- the tape's node for a differentiated shard_map (its specs place its operands)
    {OpId::shard_map,
     "shard_map",
     kNo,
     S::collective,
     P::resharding,
     kNonlinear,
     D::pullback,
     kArray,
     {}},
};
static_assert(std::size(kRows) == kOpCount, "one row per OpId");

std::array<OpDef, kOpCount> make_defs() {
  std::array<OpDef, kOpCount> defs{};
  for (size_t i = 0; i < kOpCount; ++i) {
    const Row& r = kRows[i];
    if (static_cast<size_t>(r.id) != i) {
      throw Error(
          cat("[ops] internal: the op table's row ", i, " (", r.name, ") is out of OpId order"));
    }
    const bool collective = r.placement == P::body_only;
    const bool reduces =
        r.id == OpId::psum || r.id == OpId::pmean || r.id == OpId::pmax || r.id == OpId::pmin;
    defs[i] = OpDef{r.id,
                    r.name,
                    r.attrs,
                    r.shape,
                    r.placement,
                    r.linear,
                    r.derivative,
                    (r.forms & kTensor) != 0,
                    (r.forms & kArray) != 0,
                    collective,
                    reduces,
                    r.kernel};
  }
  return defs;
}

const std::array<OpDef, kOpCount>& defs() {
  static const std::array<OpDef, kOpCount> d = make_defs();
  return d;
}

const std::vector<std::string> kNoAxes;

}  // namespace

const OpDef& op_def(OpId id) { return defs()[static_cast<size_t>(id)]; }
std::span<const OpDef> op_defs() { return defs(); }

const std::vector<std::string>& collective_axes(const OpAttrs& attrs) {
  return std::visit(
      [](const auto& a) -> const std::vector<std::string>& {
        if constexpr (requires { a.axes; }) {
          return a.axes;
        } else {
          return kNoAxes;
        }
      },
      attrs);
}

Shape broadcast_shapes(std::span<const Shape> shapes, std::string_view where) {
  size_t rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (const Shape& s : shapes) {
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t d = k + rank - s.size();
      int64_t& o = out[d];
      if (s[k] == o || s[k] == 1) continue;
      if (o != 1) {
        std::string listed;
        for (size_t i = 0; i < shapes.size(); ++i) {
          listed += cat(i == 0                   ? ""
                        : i + 1 == shapes.size() ? " and "
                                                 : ", ",
                        shape_str(shapes[i]));
        }
        throw Error(cat(where, "shapes ", listed, " are not broadcastable (dimension ", d, ": ", o,
                        " vs ", s[k], ")"));
      }
      o = s[k];
    }
  }
  return out;
}

MatmulShape matmul_shape(const Shape& a, const Shape& b, bool ta, bool tb, std::string_view op,
                         std::string_view where) {
  if (a.empty() || b.empty()) {
    throw Error(cat(where, "operands must be at least 1-D, got shapes ", shape_str(a), " and ",
                    shape_str(b), " (use multiply for scalars)"));
  }
  if ((ta && a.size() < 2) || (tb && b.size() < 2)) {
    throw Error(cat(where, "a transposed operand must be at least 2-D, got shapes ", shape_str(a),
                    " and ", shape_str(b), "; use matmul for vectors"));
  }
  // 1-D operands as matrices: a (k) -> (1, k), b (k) -> (k, 1).
  Shape sa = a, sb = b;
  if (sa.size() == 1) sa.insert(sa.begin(), 1);
  if (sb.size() == 1) sb.push_back(1);
  const int64_t ar = sa[sa.size() - 2], ac = sa.back();
  const int64_t br = sb[sb.size() - 2], bc = sb.back();
  MatmulShape r;
  r.m = ta ? ac : ar;
  r.k = ta ? ar : ac;
  r.n = tb ? br : bc;
  const int64_t kb = tb ? bc : br;
  if (r.k != kb) {
    throw Error(cat(where, "shapes ", shape_str(a), " and ", shape_str(b),
                    ta || tb ? " (read transposed)" : "", " do not align: ", op,
                    " contracts the first operand's last dimension (size ", r.k,
                    ") with the second's ", b.size() == 1 ? "only" : "second-to-last",
                    " dimension (size ", kb, "); transpose or reshape an operand"));
  }
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const Shape both[] = {ba, bb};
  r.batch = broadcast_shapes(both, cat(where, "batch dimensions: "));
  r.out = r.batch;
  if (a.size() >= 2) r.out.push_back(r.m);
  if (b.size() >= 2) r.out.push_back(r.n);
  return r;
}

Shape reduce_shape(const Shape& x, std::optional<int> axis, bool keepdims) {
  Shape out;
  for (size_t d = 0; d < x.size(); ++d) {
    const bool reduced = !axis || static_cast<int>(d) == *axis;
    if (!reduced) {
      out.push_back(x[d]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  return out;
}

}  // namespace meshrt::detail
