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

bool shape_rule_shared(ShapeRule rule) {
  switch (rule) {
    case S::broadcast:  // broadcast_shapes
    case S::reduce:     // reduce_shape
    case S::matmul:     // matmul_shape
    case S::reshape:    // reshape_shape
    case S::slice:      // slice_shape
    case S::pad:        // pad_shape
    case S::join:       // join_shape
    case S::split:      // split_shape
    case S::permute:    // permute_shape
      return true;
    case S::unset:
    case S::same:
    case S::row:
    case S::collective:
      return false;
  }
  return false;
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

int normalize_axis(int64_t axis, int64_t rank, std::string_view op, const Shape& x, Form form) {
  if (axis < -rank || axis >= rank) {
    throw Error(
        form == Form::tensor
            ? cat("[ops] ", op, ": axis ", axis, " is out of bounds for an array of shape ",
                  shape_str(x), " (rank ", rank, ")")
            : cat("[", op, "] axis ", axis, " is out of bounds for array of dimension ", rank));
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

Shape permute_shape(const Shape& x, std::vector<int>& perm, Form form) {
  const auto rank = static_cast<int>(x.size());
  if (perm.empty()) {
    for (int d = rank - 1; d >= 0; --d) perm.push_back(d);
  }
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  bool ok = static_cast<int>(perm.size()) == rank;
  for (int& p : perm) {
    if (p < -rank || p >= rank) {
      ok = false;
      break;
    }
    if (p < 0) p += rank;
    ok = ok && !seen[static_cast<size_t>(p)];
    if (ok) seen[static_cast<size_t>(p)] = true;
  }
  if (!ok) {
    throw Error(form == Form::tensor
                    ? cat("[ops] transpose: permutation ",
                          join(perm, ", ", [](int p) { return std::to_string(p); }),
                          " is not a permutation of the ", rank, " axes of shape ", shape_str(x))
                    : cat("[transpose] axes don't match array: a permutation of ", rank,
                          " axes is needed"));
  }
  Shape out;
  for (int p : perm) out.push_back(x[static_cast<size_t>(p)]);
  return out;
}

Shape slice_shape(const Shape& x, const Shape& start, const Shape& limit, const Shape& strides,
                  Form form) {
  const size_t rank = x.size();
  if (start.size() != rank || limit.size() != rank ||
      (!strides.empty() && strides.size() != rank)) {
    throw Error(form == Form::tensor
                    ? cat("[ops] slice: start ", shape_str(start), ", limit ", shape_str(limit),
                          " (and strides) need one entry per dimension of ", shape_str(x))
                    : cat("[slice] start, limit and strides need one entry per dimension of ",
                          shape_str(x)));
  }
  Shape out(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t step = strides.empty() ? 1 : strides[d];
    if (step < 1 || start[d] < 0 || limit[d] < start[d] || limit[d] > x[d]) {
      throw Error(form == Form::tensor
                      ? cat("[ops] slice: start ", shape_str(start), ", limit ", shape_str(limit),
                            " and strides ", shape_str(strides), " do not fit shape ", shape_str(x),
                            " (need 0 <= start <= limit <= dim, stride >= 1)")
                      : cat("[slice] start ", shape_str(start), ", limit ", shape_str(limit),
                            " do not fit shape ", shape_str(x)));
    }
    out[d] = (limit[d] - start[d] + step - 1) / step;
  }
  return out;
}

Shape pad_shape(const Shape& x, std::span<const std::pair<int64_t, int64_t>> widths, Form form) {
  if (widths.size() != x.size()) {
    throw Error(
        form == Form::tensor
            ? cat("[ops] pad: ", widths.size(), " (before, after) pairs given for shape ",
                  shape_str(x), "; give one per dimension")
            : cat("[pad] widths need one (before, after) pair per dimension of ", shape_str(x)));
  }
  Shape out = x;
  for (size_t d = 0; d < widths.size(); ++d) {
    const auto [before, after] = widths[d];
    if (before < 0 || after < 0) {
      throw Error(form == Form::tensor ? cat("[ops] pad: widths must be >= 0, got (", before, ", ",
                                             after, ") for dimension ", d)
                                       : std::string("[pad] widths must be >= 0"));
    }
    out[d] += before + after;
  }
  return out;
}

Shape reshape_shape(const Shape& x, Shape shape, std::string_view op, Form form) {
  const int64_t size = shape_size(x);
  // A malformed request: the Tensor ops name it; the Array ops report a size mismatch, or, where
  // the element count matches anyway, the Tensor ops' text (what their blocks' reshape said).
  std::string malformed;
  int infer = -1;
  int64_t known = 1;
  for (size_t d = 0; d < shape.size() && malformed.empty(); ++d) {
    if (shape[d] == -1 && infer < 0) {
      infer = static_cast<int>(d);
    } else if (shape[d] == -1) {
      malformed = cat("[ops] ", op, ": only one dimension may be -1, got ", shape_str(shape));
    } else if (shape[d] < 0) {
      malformed = cat("[ops] ", op, ": negative dimension in ", shape_str(shape));
    } else {
      known *= shape[d];
    }
  }
  if (infer >= 0 && malformed.empty()) {
    if (known == 0 || size % known != 0) {
      malformed = cat("[ops] ", op, ": cannot reshape ", shape_str(x), " into ", shape_str(shape));
    } else {
      shape[static_cast<size_t>(infer)] = size / known;
    }
  }
  if (!malformed.empty() && (form == Form::tensor || shape_size(shape) == size)) {
    throw Error(malformed);
  }
  if (!malformed.empty() || shape_size(shape) != size) {
    throw Error(
        form == Form::tensor
            ? cat("[ops] ", op, ": cannot reshape an array of shape ", shape_str(x), " (", size,
                  " elements) into shape ", shape_str(shape), " (", shape_size(shape), " elements)")
            : cat("[", op, "] cannot reshape array of shape ", shape_str(x), " (size ", size,
                  ") into shape ", shape_str(shape), " (size ", shape_size(shape), ")"));
  }
  return shape;
}

Shape join_shape(std::span<const Shape> xs, int axis, bool stack, Form form) {
  const Shape& s0 = xs.front();
  const auto a = static_cast<size_t>(axis);
  Shape out = s0;
  for (size_t i = 1; i < xs.size(); ++i) {
    const Shape& s = xs[i];
    bool ok = s.size() == s0.size();
    for (size_t d = 0; ok && d < s.size(); ++d) ok = s[d] == s0[d] || (!stack && d == a);
    if (!ok) {
      if (form == Form::array) {
        throw Error(
            cat("[", stack ? "stack" : "concatenate", "] all input arrays must have the same shape",
                stack ? "" : " except along axis", "; got ", shape_str(s0), " and ", shape_str(s)));
      }
      throw Error(stack ? cat("[ops] stack: all input arrays must have the same shape, got ",
                              shape_str(s0), " and ", shape_str(s))
                        : cat("[ops] concatenate: shapes ", shape_str(s0), " and ", shape_str(s),
                              " differ outside axis ", axis));
    }
    if (!stack) out[a] += s[a];
  }
  if (stack) out.insert(out.begin() + axis, static_cast<int64_t>(xs.size()));
  return out;
}

Shape split_shape(const Shape& x, int64_t sections, int axis, Form form) {
  const int64_t dim = x[static_cast<size_t>(axis)];
  if (sections < 1 || dim % sections != 0) {
    throw Error(form == Form::tensor
                    ? cat("[ops] split: array split does not result in an equal division: "
                          "dimension ",
                          axis, " of shape ", shape_str(x), " (size ", dim, ") into ", sections,
                          " sections")
                    : cat("[split] array split does not result in an equal division: ", dim,
                          " into ", sections));
  }
  Shape piece = x;
  piece[static_cast<size_t>(axis)] = dim / sections;
  return piece;
}

}  // namespace meshrt::detail
