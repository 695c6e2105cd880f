// Device-local ops: shapes, dtypes and checks here; the arithmetic in the backend's kernels.
#include "runtime/tensor_ops.h"

#include <algorithm>
#include <atomic>
#include <numeric>

#include "backends/backend.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strided.h"
#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/detail/copy.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/trace.h"

namespace meshrt {

using backend::BinaryOp;
using backend::ReduceOp;
using backend::Strided;
using backend::UnaryOp;
using detail::cat;
using detail::OpId;

namespace {

backend::Backend& be(const Tensor& t) { return detail::backend_of(t.device()); }
int dev(const Tensor& t) { return t.device().local_index(); }

void check_valid(const Tensor& t, const char* op) {
  if (!t.valid())
    throw Error(cat("[ops] ", op, ": an operand is an empty (default-constructed) Tensor"));
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  check_valid(a, op);
  check_valid(b, op);
  if (a.device() == b.device()) return;
  if (a.device().platform() != b.device().platform()) {
    throw Error(
        cat("[ops] ", op, ": operands live on ", a.device().str(), " and ", b.device().str(),
            " (different platforms); move data between platforms explicitly with device_put"));
  }
  throw Error(cat(
      "[ops] ", op, ": operands live on ", a.device().str(), " and ", b.device().str(),
      "; an op takes tensors of one device (compute per device inside shard_map, or device_put)"));
}

std::vector<int64_t> dense(const Shape& s) { return core::dense_strides(s); }

// Strides to read `t` as if it had `out` shape (right-aligned broadcasting).
std::vector<int64_t> broadcast_strides(const Tensor& t, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  const std::vector<int64_t> ds = dense(t.shape());
  const size_t off = out.size() - t.shape().size();
  for (size_t d = 0; d < t.shape().size(); ++d) st[off + d] = t.shape()[d] == 1 ? 0 : ds[d];
  return st;
}

// "[ops] add: ", the start of an op's shape errors.
std::string ops_where(std::string_view op) { return cat("[ops] ", op, ": "); }

Tensor cast(const Tensor& x, DType to) { return x.dtype() == to ? x : astype(x, to); }

Tensor scalar_like(double v, DType dtype, Device d) {
  Tensor t = empty({}, dtype, d);
  detail::backend_of(d).fill(d.local_index(), dtype, 1, v, false, t.data());
  return t;
}

// The dtype of tensor-op-scalar (JAX weak typing, x64).
DType weak_result(DType t, const Scalar& s) {
  if (is_floating(t)) return t;
  if (!s.integral) return DType::f64;
  return t == DType::bool_ ? DType::i64 : t;
}

Tensor binary_op(OpId id, const Tensor& a0, const Tensor& b0) {
  const detail::OpDef& def = detail::op_def(id);
  const BinaryOp op = std::get<BinaryOp>(def.kernel);
  const char* name = def.name.data();
  detail::Traced<Tensor> tr(id, {&a0, &b0});
  check_same_device(a0, b0, name);
  DType t = promote_types(a0.dtype(), b0.dtype());
  if (op == BinaryOp::div) t = float_dtype_for(t);
  if (op == BinaryOp::sub && t == DType::bool_) {
    throw Error(cat("[ops] ", name,
                    ": subtracting bool arrays is not supported (as in NumPy); use not_equal, "
                    "or astype to an integer type first"));
  }
  const Tensor a = cast(a0, t), b = cast(b0, t);
  const Shape shape = detail::broadcast_shapes(a.shape(), b.shape(), ops_where(name));
  const DType out_t = backend::is_comparison(op) ? DType::bool_ : t;
  Tensor y = empty(shape, out_t, a.device());
  be(a).binary(dev(a), op, t, out_t, shape, {a.data(), broadcast_strides(a, shape)},
               {b.data(), broadcast_strides(b, shape)}, y.data());
  return tr(y);
}

// `x op s` (`s op x` when scalar_first), reported as the *_scalar op `id` with its value; the
// work is the tensor-tensor op `as` with the scalar as a 0-d operand.
Tensor scalar_op(OpId id, OpId as, const Tensor& x, Scalar s, bool scalar_first) {
  detail::Traced<Tensor> tr(id, {&x});
  if (tr) tr.set_attrs(detail::ScalarAttrs{s.value, s.integral});
  check_valid(x, detail::op_name(as).data());
  DType t = weak_result(x.dtype(), s);
  Tensor xs = cast(x, t);
  Tensor c = scalar_like(s.value, t, x.device());
  return tr(scalar_first ? binary_op(as, c, xs) : binary_op(as, xs, c));
}

Tensor unary_op(OpId id, const Tensor& x0, bool to_float) {
  const UnaryOp op = std::get<UnaryOp>(detail::op_def(id).kernel);
  detail::Traced<Tensor> tr(id, {&x0});
  check_valid(x0, detail::op_name(id).data());
  const Tensor x = to_float ? cast(x0, float_dtype_for(x0.dtype())) : x0;
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  be(x).unary(dev(x), op, x.dtype(), x.dtype(), x.shape(), {x.data(), dense(x.shape())}, y.data());
  return tr(y);
}

// A strided view of x (offset in elements) copied into a new dense tensor of `shape`.
Tensor gather_view(const Tensor& x, const Shape& shape, int64_t offset,
                   const std::vector<int64_t>& strides) {
  Tensor y = empty(shape, x.dtype(), x.device());
  const char* base =
      static_cast<const char*>(x.data()) + offset * static_cast<int64_t>(dtype_size(x.dtype()));
  be(x).unary(dev(x), UnaryOp::copy, x.dtype(), x.dtype(), shape, {base, strides}, y.data());
  return y;
}

// Copies all of `src` into `dst` at `at` (same device).
void place(const Tensor& dst, const Tensor& src, const Shape& at) {
  detail::copy_box({dst.data(), dst.shape(), at, dst.device(), false},
                   {src.data(), src.shape(), Shape(src.shape().size(), 0), src.device(), false},
                   src.shape(), dtype_size(src.dtype()));
}

struct Reduced {
  int64_t outer = 1, len = 1, inner = 1;
  Shape out_shape;
};

Reduced plan_reduce(const Tensor& x, std::optional<int> axis, bool keepdims, const char* op) {
  Reduced r;
  const Shape& s = x.shape();
  if (!axis) {
    r.len = x.size();
    r.out_shape = keepdims ? Shape(s.size(), 1) : Shape{};
    return r;
  }
  const int a =
      detail::normalize_axis(*axis, static_cast<int64_t>(s.size()), op, s, detail::Form::tensor);
  for (int d = 0; d < a; ++d) r.outer *= s[static_cast<size_t>(d)];
  r.len = s[static_cast<size_t>(a)];
  for (size_t d = static_cast<size_t>(a) + 1; d < s.size(); ++d) r.inner *= s[d];
  r.out_shape = detail::reduce_shape(s, a, keepdims);
  return r;
}

Tensor reduce_op(ReduceOp op, const Tensor& x0, std::optional<int> axis, bool keepdims,
                 const char* name) {
  detail::Traced<Tensor> tr(op == ReduceOp::sum   ? OpId::sum
                            : op == ReduceOp::max ? OpId::max
                            : op == ReduceOp::min ? OpId::min
                                                  : OpId::argmax,
                            {&x0});
  if (tr) tr.set_attrs(detail::ReduceAttrs{axis, keepdims});
  check_valid(x0, name);
  Reduced r = plan_reduce(x0, axis, keepdims, name);
  if ((op == ReduceOp::max || op == ReduceOp::min || op == ReduceOp::argmax) && r.len == 0) {
    throw Error(cat("[ops] ", name, ": zero-size array ", shape_str(x0.shape()),
                    " to reduction operation which has no identity"));
  }
  // JAX (x64): integer and bool sums are int64; max/min of bool stay bool; argmax gives int64.
  DType work = x0.dtype();
  if (op == ReduceOp::sum && !is_floating(work)) work = DType::i64;
  if (op != ReduceOp::sum && work == DType::bool_) work = DType::i32;
  const Tensor x = cast(x0, work);
  const DType out_t = op == ReduceOp::argmax ? DType::i64 : work;
  Tensor y = empty(r.out_shape, out_t, x.device());
  be(x).reduce(dev(x), op, work, r.outer, r.len, r.inner, x.data(), y.data());
  if ((op == ReduceOp::max || op == ReduceOp::min) && x0.dtype() == DType::bool_)
    return tr(astype(y, DType::bool_));
  return tr(y);
}

}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType t) {
    switch (t) {
      case DType::bool_:
        return 0;
      case DType::i32:
        return 1;
      case DType::i64:
        return 2;
      case DType::bf16:
      case DType::f16:
        return 3;
      case DType::f32:
        return 4;
      case DType::f64:
        return 5;
    }
    return 0;
  };
  // JAX's lattice with x64: bool < ints < {bf16, f16} < f32 < f64; any int with a float gives the
  // float; bf16 with f16 meet at float32.
  if (rank(a) == 3 && rank(b) == 3) return DType::f32;
  return rank(a) > rank(b) ? a : b;
}

DType float_dtype_for(DType x) {
  switch (x) {
    case DType::f64:
    case DType::i64:
      return DType::f64;
    case DType::bf16:
    case DType::f16:
      return x;
    default:
      return DType::f32;
  }
}

// ---- creation
Tensor full(Shape shape, double value, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  detail::backend_of(device).fill(device.local_index(), dtype, t.size(), value, false, t.data());
  return t;
}
Tensor zeros(Shape shape, DType dtype, Device device) {
  return full(std::move(shape), 0.0, dtype, device);
}
Tensor ones(Shape shape, DType dtype, Device device) {
  return full(std::move(shape), 1.0, dtype, device);
}
Tensor arange(int64_t n, DType dtype, Device device) {
  if (n < 0) throw Error(cat("[ops] arange: n = ", n, " is negative"));
  Tensor t = empty({n}, dtype, device);
  detail::backend_of(device).fill(device.local_index(), dtype, n, 0.0, true, t.data());
  return t;
}
Tensor astype(const Tensor& x, DType dtype) {
  detail::Traced<Tensor> tr(OpId::astype, {&x});
  check_valid(x, "astype");
  Tensor y = empty(x.shape(), dtype, x.device());
  be(x).unary(dev(x), UnaryOp::copy, x.dtype(), dtype, x.shape(), {x.data(), dense(x.shape())},
              y.data());
  return tr(y);
}
Tensor copy(const Tensor& x) {
  check_valid(x, "copy");
  return astype(x, x.dtype());
}

// ---- elementwise
Tensor add(const Tensor& a, const Tensor& b) { return binary_op(OpId::add, a, b); }
Tensor subtract(const Tensor& a, const Tensor& b) { return binary_op(OpId::subtract, a, b); }
Tensor multiply(const Tensor& a, const Tensor& b) { return binary_op(OpId::multiply, a, b); }
Tensor divide(const Tensor& a, const Tensor& b) { return binary_op(OpId::divide, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_op(OpId::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary_op(OpId::minimum, a, b); }
Tensor equal(const Tensor& a, const Tensor& b) { return binary_op(OpId::equal, a, b); }
Tensor not_equal(const Tensor& a, const Tensor& b) { return binary_op(OpId::not_equal, a, b); }
Tensor less(const Tensor& a, const Tensor& b) { return binary_op(OpId::less, a, b); }
Tensor less_equal(const Tensor& a, const Tensor& b) { return binary_op(OpId::less_equal, a, b); }
Tensor greater(const Tensor& a, const Tensor& b) { return binary_op(OpId::greater, a, b); }
Tensor greater_equal(const Tensor& a, const Tensor& b) {
  return binary_op(OpId::greater_equal, a, b);
}

Tensor add(const Tensor& a, Scalar b) {
  return scalar_op(OpId::add_scalar, OpId::add, a, b, false);
}
Tensor subtract(const Tensor& a, Scalar b) {
  return scalar_op(OpId::sub_scalar, OpId::subtract, a, b, false);
}
Tensor subtract(Scalar a, const Tensor& b) {
  return scalar_op(OpId::rsub_scalar, OpId::subtract, b, a, true);
}
Tensor multiply(const Tensor& a, Scalar b) {
  return scalar_op(OpId::mul_scalar, OpId::multiply, a, b, false);
}
Tensor divide(const Tensor& a, Scalar b) {
  return scalar_op(OpId::div_scalar, OpId::divide, a, b, false);
}
Tensor divide(Scalar a, const Tensor& b) {
  return scalar_op(OpId::rdiv_scalar, OpId::divide, b, a, true);
}
Tensor maximum(const Tensor& a, Scalar b) {
  return scalar_op(OpId::max_scalar, OpId::maximum, a, b, false);
}
Tensor minimum(const Tensor& a, Scalar b) {
  return scalar_op(OpId::min_scalar, OpId::minimum, a, b, false);
}
Tensor equal(const Tensor& a, Scalar b) {
  return scalar_op(OpId::equal_scalar, OpId::equal, a, b, false);
}
Tensor not_equal(const Tensor& a, Scalar b) {
  return scalar_op(OpId::not_equal_scalar, OpId::not_equal, a, b, false);
}
Tensor less(const Tensor& a, Scalar b) {
  return scalar_op(OpId::less_scalar, OpId::less, a, b, false);
}
Tensor less_equal(const Tensor& a, Scalar b) {
  return scalar_op(OpId::less_equal_scalar, OpId::less_equal, a, b, false);
}
Tensor greater(const Tensor& a, Scalar b) {
  return scalar_op(OpId::greater_scalar, OpId::greater, a, b, false);
}
Tensor greater_equal(const Tensor& a, Scalar b) {
  return scalar_op(OpId::greater_equal_scalar, OpId::greater_equal, a, b, false);
}

Tensor where(const Tensor& cond, const Tensor& a0, const Tensor& b0) {
  detail::Traced<Tensor> tr(OpId::where, {&cond, &a0, &b0});
  check_same_device(cond, a0, "where");
  check_same_device(a0, b0, "where");
  if (cond.dtype() != DType::bool_) {
    throw Error(cat("[ops] where: the condition is ", dtype_name(cond.dtype()),
                    "; pass a bool tensor (a comparison, or astype(c, DType::bool_))"));
  }
  const DType t = promote_types(a0.dtype(), b0.dtype());
  const Tensor a = cast(a0, t), b = cast(b0, t);
  const Shape shapes[] = {cond.shape(), a.shape(), b.shape()};
  const Shape shape = detail::broadcast_shapes(shapes, ops_where("where"));
  Tensor y = empty(shape, t, a.device());
  be(a).select(dev(a), t, shape, {cond.data(), broadcast_strides(cond, shape)},
               {a.data(), broadcast_strides(a, shape)}, {b.data(), broadcast_strides(b, shape)},
               y.data());
  return tr(y);
}

Tensor neg(const Tensor& x) {
  if (x.valid() && x.dtype() == DType::bool_)
    throw Error("[ops] neg: negating a bool tensor is not supported");
  return unary_op(OpId::neg, x, false);
}
Tensor exp(const Tensor& x) { return unary_op(OpId::exp, x, true); }
Tensor log(const Tensor& x) { return unary_op(OpId::log, x, true); }
Tensor sin(const Tensor& x) { return unary_op(OpId::sin, x, true); }
Tensor cos(const Tensor& x) { return unary_op(OpId::cos, x, true); }
Tensor tanh(const Tensor& x) { return unary_op(OpId::tanh, x, true); }
Tensor sqrt(const Tensor& x) { return unary_op(OpId::sqrt, x, true); }
Tensor relu(const Tensor& x) { return unary_op(OpId::relu, x, false); }

// ---- reductions
Tensor sum(const Tensor& x, std::optional<int> axis, bool keepdims) {
  return reduce_op(ReduceOp::sum, x, axis, keepdims, "sum");
}
Tensor max(const Tensor& x, std::optional<int> axis, bool keepdims) {
  return reduce_op(ReduceOp::max, x, axis, keepdims, "max");
}
Tensor min(const Tensor& x, std::optional<int> axis, bool keepdims) {
  return reduce_op(ReduceOp::min, x, axis, keepdims, "min");
}
Tensor argmax(const Tensor& x, std::optional<int> axis, bool keepdims) {
  return reduce_op(ReduceOp::argmax, x, axis, keepdims, "argmax");
}
Tensor mean(const Tensor& x, std::optional<int> axis, bool keepdims) {
  check_valid(x, "mean");
  // bf16/f16 (jnp.mean): summed and divided in float32, rounded once.
  if (is_half(x.dtype())) return astype(mean(astype(x, DType::f32), axis, keepdims), x.dtype());
  const Tensor xf = cast(x, float_dtype_for(x.dtype()));
  Reduced r = plan_reduce(xf, axis, keepdims, "mean");
  return divide(reduce_op(ReduceOp::sum, xf, axis, keepdims, "mean"),
                Scalar(static_cast<double>(r.len)));
}
// As jax.nn: shifted = x - max(x); log_softmax = shifted - log(sum(exp(shifted))).
Tensor log_softmax(const Tensor& x0, int axis) {
  detail::Traced<Tensor> tr(OpId::log_softmax, {&x0});
  if (tr) tr.set_attrs(detail::AxisAttrs{axis});
  check_valid(x0, "log_softmax");
  const Tensor x = cast(x0, float_dtype_for(x0.dtype()));
  const Tensor shifted = x - max(x, axis, true);
  return tr(shifted - log(sum(exp(shifted), axis, true)));
}
Tensor softmax(const Tensor& x0, int axis) {
  detail::Traced<Tensor> tr(OpId::softmax, {&x0});
  if (tr) tr.set_attrs(detail::AxisAttrs{axis});
  check_valid(x0, "softmax");
  const Tensor x = cast(x0, float_dtype_for(x0.dtype()));
  const Tensor e = exp(x - max(x, axis, true));
  return tr(e / sum(e, axis, true));
}

// ---- linear algebra
namespace {

// a @ b (jnp.matmul), with a stored (..., k, m) when ta and b stored (..., n, k) when tb.
Tensor matmul_impl(const Tensor& a0, const Tensor& b0, bool ta, bool tb, const char* name,
                   Precision precision) {
  check_same_device(a0, b0, name);
  const detail::MatmulShape ms =
      detail::matmul_shape(a0.shape(), b0.shape(), ta, tb, name, ops_where(name));
  const DType t = promote_types(a0.dtype(), b0.dtype());
  if (t == DType::bool_) {
    throw Error(cat("[ops] ", name, " of bool tensors: convert with astype first"));
  }
  // 1-D operands are promoted to matrices and the added dimension removed afterwards (jnp.matmul).
  Tensor a = cast(a0, t), b = cast(b0, t);
  if (a.ndim() == 1) a = reshape(a, {1, a.shape()[0]});
  if (b.ndim() == 1) b = reshape(b, {b.shape()[0], 1});
  const int64_t ar = a.shape()[static_cast<size_t>(a.ndim() - 2)], ac = a.shape().back();
  const int64_t br = b.shape()[static_cast<size_t>(b.ndim() - 2)], bc = b.shape().back();
  const int64_t m = ms.m, k = ms.k, n = ms.n;
  const Shape& batch = ms.batch;
  Shape a_full = batch, b_full = batch;
  a_full.insert(a_full.end(), {ar, ac});
  b_full.insert(b_full.end(), {br, bc});
  // Batch dims that broadcast are materialised so the kernel sees dense batches.
  if (a.shape() != a_full) a = gather_view(a, a_full, 0, broadcast_strides(a, a_full));
  if (b.shape() != b_full) b = gather_view(b, b_full, 0, broadcast_strides(b, b_full));
  Tensor y = empty(ms.out, t, a.device());
  be(a).product(dev(a), t, shape_size(batch), m, n, k, a.data(), ta, b.data(), tb, y.data(),
                precision);
  return y;
}

std::atomic<int> g_default_precision{-1};  // -1: not chosen yet (read the environment)

Precision precision_of(const MatmulOptions& o) {
  return o.precision ? *o.precision : default_matmul_precision();
}
}  // namespace

void set_default_matmul_precision(Precision precision) {
  g_default_precision.store(static_cast<int>(precision));
}
Precision default_matmul_precision() {
  int p = g_default_precision.load();
  if (p < 0) {
    p = static_cast<int>(config::matmul_tf32() ? Precision::tf32 : Precision::highest);
    int unset = -1;
    g_default_precision.compare_exchange_strong(unset, p);
    p = g_default_precision.load();
  }
  return static_cast<Precision>(p);
}

Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& o) {
  const Precision p = precision_of(o);
  detail::Traced<Tensor> tr(OpId::matmul, {&a, &b});
  if (tr) tr.set_attrs(detail::MatmulAttrs{false, false, p});
  return tr(matmul_impl(a, b, false, false, "matmul", p));
}

Tensor matmul_transposed(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                         const MatmulOptions& o) {
  const Precision p = precision_of(o);
  detail::Traced<Tensor> tr(OpId::matmul_transposed, {&a, &b});
  if (tr) tr.set_attrs(detail::MatmulAttrs{transpose_a, transpose_b, p});
  return tr(matmul_impl(a, b, transpose_a, transpose_b, "matmul_transposed", p));
}

Tensor dot(const Tensor& a, const Tensor& b, const MatmulOptions& o) {
  check_same_device(a, b, "dot");
  if (a.ndim() <= 2 && b.ndim() <= 2 && a.ndim() >= 1 && b.ndim() >= 1) return matmul(a, b, o);
  if (b.ndim() == 1 && a.ndim() > 2) return matmul(a, b, o);  // contracts the last axis of a
  if (a.ndim() == 0 || b.ndim() == 0) return multiply(a, b);
  throw Error(
      cat("[ops] dot: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
          " need jnp.dot's N-D by M-D contraction, which is not provided; use matmul (batched) "
          "or transpose/reshape to 2-D"));
}

Tensor transpose(const Tensor& x, std::vector<int> perm) {
  detail::Traced<Tensor> tr(OpId::transpose, {&x});
  check_valid(x, "transpose");
  const Shape out = detail::permute_shape(x.shape(), perm, detail::Form::tensor);
  const std::vector<int64_t> ds = dense(x.shape());
  std::vector<int64_t> st;
  for (int p : perm) st.push_back(ds[static_cast<size_t>(p)]);
  if (tr) tr.set_attrs(detail::PermAttrs{{perm.begin(), perm.end()}});
  return tr(gather_view(x, out, 0, st));
}

// ---- shape
Tensor reshape(const Tensor& x, Shape shape) {
  detail::Traced<Tensor> tr(OpId::reshape, {&x});
  check_valid(x, "reshape");
  shape = detail::reshape_shape(x.shape(), std::move(shape), "reshape", detail::Form::tensor);
  return tr(detail::TensorAccess::make(detail::TensorAccess::buffer(x),
                                       detail::TensorAccess::byte_offset(x), std::move(shape),
                                       x.dtype(),
                                       x.device()));  // same buffer
}

namespace {
Tensor row_view(const Tensor& x, int64_t i, const std::string& op) {
  detail::Traced<Tensor> tr(OpId::row, {&x});
  check_valid(x, op.c_str());
  if (x.shape().empty()) throw Error(cat("[ops] ", op, ": indexing a 0-d tensor (it has no rows)"));
  const int64_t n = x.shape()[0];
  if (i < -n || i >= n) {
    throw Error(cat("[ops] ", op, ": index ", i, " is out of bounds for axis 0 with size ", n,
                    " (negative indices count from the end)"));
  }
  if (i < 0) i += n;
  if (tr) tr.set_attrs(detail::RowAttrs{i});
  Shape rest(x.shape().begin() + 1, x.shape().end());
  const size_t row_bytes = static_cast<size_t>(shape_size(rest)) * dtype_size(x.dtype());
  return tr(detail::TensorAccess::make(
      detail::TensorAccess::buffer(x),
      detail::TensorAccess::byte_offset(x) + static_cast<size_t>(i) * row_bytes, std::move(rest),
      x.dtype(), x.device()));  // same buffer
}
}  // namespace

Tensor row(const Tensor& x, int64_t i) { return row_view(x, i, "row"); }
Tensor Tensor::operator[](int64_t i) const { return row_view(*this, i, cat("t[", i, "]")); }

Tensor slice(const Tensor& x, const Shape& start, const Shape& limit, const Shape& strides) {
  detail::Traced<Tensor> tr(OpId::slice, {&x});
  check_valid(x, "slice");
  const Shape out = detail::slice_shape(x.shape(), start, limit, strides, detail::Form::tensor);
  const size_t rank = out.size();
  const std::vector<int64_t> ds = dense(x.shape());
  std::vector<int64_t> st(rank);
  int64_t offset = 0;
  for (size_t d = 0; d < rank; ++d) {
    st[d] = ds[d] * (strides.empty() ? 1 : strides[d]);
    offset += start[d] * ds[d];
  }
  if (tr)
    tr.set_attrs(detail::SliceAttrs{start, limit, strides.empty() ? Shape(rank, 1) : strides});
  return tr(gather_view(x, out, offset, st));
}

Tensor slice_in_dim(const Tensor& x, int64_t start, int64_t limit, int64_t stride, int axis) {
  check_valid(x, "slice_in_dim");
  const int a =
      detail::normalize_axis(axis, x.ndim(), "slice_in_dim", x.shape(), detail::Form::tensor);
  Shape s(x.shape().size(), 0), l = x.shape(), st(x.shape().size(), 1);
  s[static_cast<size_t>(a)] = start;
  l[static_cast<size_t>(a)] = limit;
  st[static_cast<size_t>(a)] = stride;
  return slice(x, s, l, st);
}

Tensor dynamic_slice_in_dim(const Tensor& x, int64_t start, int64_t size, int axis) {
  check_valid(x, "dynamic_slice_in_dim");
  const int a = detail::normalize_axis(axis, x.ndim(), "dynamic_slice_in_dim", x.shape(),
                                       detail::Form::tensor);
  const int64_t dim = x.shape()[static_cast<size_t>(a)];
  if (size < 0 || size > dim) {
    throw Error(cat("[ops] dynamic_slice_in_dim: slice size ", size, " does not fit dimension ", a,
                    " of shape ", shape_str(x.shape())));
  }
  start =
      std::clamp<int64_t>(start, 0, dim - size);  // as XLA: the start is clamped, never an error
  return slice_in_dim(x, start, start + size, 1, a);
}

Tensor dynamic_update_slice(const Tensor& x, const Tensor& update, const Shape& starts) {
  detail::Traced<Tensor> tr(OpId::dynamic_update_slice, {&x, &update});
  check_same_device(x, update, "dynamic_update_slice");
  if (update.ndim() != x.ndim() || starts.size() != x.shape().size()) {
    throw Error(cat("[ops] dynamic_update_slice: update ", shape_str(update.shape()),
                    " and starts ", shape_str(starts), " must have the rank of ",
                    shape_str(x.shape())));
  }
  Shape at(starts.size());
  for (size_t d = 0; d < starts.size(); ++d) {
    if (update.shape()[d] > x.shape()[d]) {
      throw Error(cat("[ops] dynamic_update_slice: update ", shape_str(update.shape()),
                      " is larger than ", shape_str(x.shape()), " in dimension ", d));
    }
    at[d] = std::clamp<int64_t>(starts[d], 0, x.shape()[d] - update.shape()[d]);
  }
  Tensor y = copy(x);
  place(y, cast(update, x.dtype()), at);
  if (tr) tr.set_attrs(detail::UpdateSliceAttrs{at});
  return tr(y);
}

Tensor concatenate(const std::vector<Tensor>& xs, int axis) {
  detail::Traced<Tensor> tr(OpId::concatenate, xs);
  if (xs.empty()) throw Error("[ops] concatenate: needs at least one tensor");
  check_valid(xs[0], "concatenate");
  const int a = detail::normalize_axis(axis, xs[0].ndim(), "concatenate", xs[0].shape(),
                                       detail::Form::tensor);
  DType t = xs[0].dtype();
  std::vector<Shape> shapes;
  for (const Tensor& x : xs) {
    check_same_device(xs[0], x, "concatenate");
    t = promote_types(t, x.dtype());
    shapes.push_back(x.shape());
  }
  const Shape out = detail::join_shape(shapes, a, /*stack=*/false, detail::Form::tensor);
  Tensor y = empty(out, t, xs[0].device());
  Shape at(out.size(), 0);
  for (const Tensor& x : xs) {
    place(y, cast(x, t), at);
    at[static_cast<size_t>(a)] += x.shape()[static_cast<size_t>(a)];
  }
  if (tr) tr.set_attrs(detail::AxisAttrs{a});
  return tr(y);
}

std::vector<Tensor> split(const Tensor& x, int64_t sections, int axis) {
  check_valid(x, "split");
  const int a = detail::normalize_axis(axis, x.ndim(), "split", x.shape(), detail::Form::tensor);
  const int64_t w =
      detail::split_shape(x.shape(), sections, a, detail::Form::tensor)[static_cast<size_t>(a)];
  std::vector<Tensor> out;
  for (int64_t i = 0; i < sections; ++i) out.push_back(slice_in_dim(x, i * w, (i + 1) * w, 1, a));
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int axis) {
  if (xs.empty()) throw Error("[ops] stack: needs at least one tensor");
  check_valid(xs[0], "stack");
  const int a =
      detail::normalize_axis(axis, xs[0].ndim() + 1, "stack", xs[0].shape(), detail::Form::tensor);
  std::vector<Shape> shapes;
  for (const Tensor& x : xs) {
    check_valid(x, "stack");
    shapes.push_back(x.shape());
  }
  (void)detail::join_shape(shapes, a, /*stack=*/true, detail::Form::tensor);
  std::vector<Tensor> parts;
  for (const Tensor& x : xs) parts.push_back(expand_dims(x, a));
  return concatenate(parts, a);
}

Tensor squeeze(const Tensor& x, std::vector<int> axes) {
  check_valid(x, "squeeze");
  const auto rank = x.ndim();
  std::vector<bool> drop(static_cast<size_t>(rank), false);
  if (axes.empty()) {
    for (int64_t d = 0; d < rank; ++d)
      drop[static_cast<size_t>(d)] = x.shape()[static_cast<size_t>(d)] == 1;
  }
  for (int ax : axes) {
    const int a = detail::normalize_axis(ax, rank, "squeeze", x.shape(), detail::Form::tensor);
    if (x.shape()[static_cast<size_t>(a)] != 1) {
      throw Error(
          cat("[ops] squeeze: cannot select an axis to squeeze out which has size not equal to "
              "one: axis ",
              a, " of shape ", shape_str(x.shape())));
    }
    drop[static_cast<size_t>(a)] = true;
  }
  Shape out;
  for (int64_t d = 0; d < rank; ++d) {
    if (!drop[static_cast<size_t>(d)]) out.push_back(x.shape()[static_cast<size_t>(d)]);
  }
  return reshape(x, out);
}

Tensor expand_dims(const Tensor& x, int axis) {
  check_valid(x, "expand_dims");
  const int a =
      detail::normalize_axis(axis, x.ndim() + 1, "expand_dims", x.shape(), detail::Form::tensor);
  Shape out = x.shape();
  out.insert(out.begin() + a, 1);
  return reshape(x, out);
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& widths, double value) {
  detail::Traced<Tensor> tr(OpId::pad, {&x});
  if (tr) tr.set_attrs(detail::PadAttrs{widths, value});
  check_valid(x, "pad");
  const Shape out = detail::pad_shape(x.shape(), widths, detail::Form::tensor);
  Shape at(widths.size());
  for (size_t d = 0; d < widths.size(); ++d) at[d] = widths[d].first;
  Tensor y = full(out, value, x.dtype(), x.device());
  place(y, x, at);
  return tr(y);
}

}  // namespace meshrt
