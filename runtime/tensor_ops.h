// runtime/tensor_ops.h: device-local operations on Tensors (inside shard_map bodies or on the
// host).
//
// Semantics follow NumPy/JAX with 64-bit types enabled (jax_enable_x64): NumPy broadcasting,
// JAX's dtype promotion (int32 + float32 -> float32, int64 + float32 -> float32, ...), true
// division of integers gives floats (int32 -> float32, int64 -> float64), sums of integers are
// int64, argmax returns int64. A double scalar is "weak": it takes a float tensor's dtype and
// turns integer tensors into float64; an integer scalar takes an integer tensor's dtype.
// Operands must live on one device; mixing devices or platforms is an Error naming both.
// Every op dispatches through the tensor's backend, so a platform only adds kernels. Ops return
// new Tensors (never modify operands) and are thread-safe: bodies on different devices call them
// at once. The compound assignments (+= ...) rebind their left side to the new Tensor, as
// `x += y` does in JAX (`x = x + y`: the dtype and shape may change; other copies of x keep
// the old value).
//
//   Tensor h = relu(matmul(x, w) + b);           // b broadcasts over rows
//   Tensor loss = mean((h - y) * (h - y));
//   h *= 0.5; Tensor mask = h > 0.0; Tensor first = h[0];
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace meshrt {

// ---- creation and conversion

Tensor zeros(Shape shape, DType dtype, Device device);  // jnp.zeros on `device`
Tensor ones(Shape shape, DType dtype, Device device);   // jnp.ones on `device`
// jnp.full on `device`: every element `value`, cast to dtype.
Tensor full(Shape shape, double value, DType dtype, Device device);
Tensor arange(int64_t n, DType dtype, Device device);  // 0, 1, ..., n-1
Tensor astype(const Tensor& x, DType dtype);           // x.astype(dtype): converted as NumPy does
Tensor copy(const Tensor& x);                          // a new buffer with the same values

// ---- elementwise (broadcasting)

Tensor add(const Tensor& a, const Tensor& b);                        // a + b
Tensor subtract(const Tensor& a, const Tensor& b);                   // a - b
Tensor multiply(const Tensor& a, const Tensor& b);                   // a * b
Tensor divide(const Tensor& a, const Tensor& b);                     // true division
Tensor maximum(const Tensor& a, const Tensor& b);                    // NaN propagates
Tensor minimum(const Tensor& a, const Tensor& b);                    // NaN propagates
Tensor equal(const Tensor& a, const Tensor& b);                      // comparisons give bool
Tensor not_equal(const Tensor& a, const Tensor& b);                  // a != b
Tensor less(const Tensor& a, const Tensor& b);                       // a < b
Tensor less_equal(const Tensor& a, const Tensor& b);                 // a <= b
Tensor greater(const Tensor& a, const Tensor& b);                    // a > b
Tensor greater_equal(const Tensor& a, const Tensor& b);              // a >= b
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // cond is bool

Tensor neg(const Tensor& x);   // -x
Tensor exp(const Tensor& x);   // integer inputs give floats
Tensor log(const Tensor& x);   // natural logarithm; integer inputs give floats
Tensor sin(const Tensor& x);   // integer inputs give floats
Tensor cos(const Tensor& x);   // integer inputs give floats
Tensor tanh(const Tensor& x);  // integer inputs give floats
Tensor sqrt(const Tensor& x);  // integer inputs give floats
Tensor relu(const Tensor& x);  // max(x, 0), jax.nn.relu

// A scalar operand, as a Python scalar in JAX (weakly typed, see above). Every arithmetic C++
// type converts: float and double are weak floats; int, long, unsigned, size_t (so
// `x / v.size()` works), the other integer types and bool (as 0 or 1) are weak integers.
struct Scalar {
  // Any arithmetic value; implicit, so `x * 2` and `x / v.size()` work.
  template <class T, class = std::enable_if_t<std::is_arithmetic_v<T>>>
  Scalar(T v)  // NOLINT(google-explicit-constructor): scalars convert implicitly, as in JAX
      : value(static_cast<double>(v)), integral(std::is_integral_v<T>) {}
  double value;   // the value, as a double
  bool integral;  // a weak integer (from an integer type or bool), else a weak float
};
Tensor add(const Tensor& a, Scalar b);            // a + b
Tensor subtract(const Tensor& a, Scalar b);       // a - b
Tensor subtract(Scalar a, const Tensor& b);       // a - b
Tensor multiply(const Tensor& a, Scalar b);       // a * b
Tensor divide(const Tensor& a, Scalar b);         // a / b, true division
Tensor divide(Scalar a, const Tensor& b);         // a / b, true division
Tensor maximum(const Tensor& a, Scalar b);        // NaN propagates
Tensor minimum(const Tensor& a, Scalar b);        // NaN propagates
Tensor equal(const Tensor& a, Scalar b);          // the scalar weakly typed as above; bool results
Tensor not_equal(const Tensor& a, Scalar b);      // a != b
Tensor less(const Tensor& a, Scalar b);           // a < b
Tensor less_equal(const Tensor& a, Scalar b);     // a <= b
Tensor greater(const Tensor& a, Scalar b);        // a > b
Tensor greater_equal(const Tensor& a, Scalar b);  // a >= b

// Operators: `a + b` is add(a, b), `a - b` subtract, `a * b` multiply, `a / b` divide, `-x`
// neg(x), and `==`, `!=`, `<`, `<=`, `>`, `>=` the comparisons (bool results); a Scalar may
// stand on either side. `a += b` (and -=, *=, /=) rebinds `a` to the new Tensor, as `a = a + b`.
//@{
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return subtract(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return multiply(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return divide(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
inline Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(const Tensor& a, Scalar b) { return subtract(a, b); }
inline Tensor operator-(Scalar a, const Tensor& b) { return subtract(a, b); }
inline Tensor operator*(const Tensor& a, Scalar b) { return multiply(a, b); }
inline Tensor operator*(Scalar a, const Tensor& b) { return multiply(b, a); }
inline Tensor operator/(const Tensor& a, Scalar b) { return divide(a, b); }
inline Tensor operator/(Scalar a, const Tensor& b) { return divide(a, b); }
inline Tensor operator==(const Tensor& a, const Tensor& b) { return equal(a, b); }
inline Tensor operator!=(const Tensor& a, const Tensor& b) { return not_equal(a, b); }
inline Tensor operator<(const Tensor& a, const Tensor& b) { return less(a, b); }
inline Tensor operator<=(const Tensor& a, const Tensor& b) { return less_equal(a, b); }
inline Tensor operator>(const Tensor& a, const Tensor& b) { return greater(a, b); }
inline Tensor operator>=(const Tensor& a, const Tensor& b) { return greater_equal(a, b); }
inline Tensor operator==(const Tensor& a, Scalar b) { return equal(a, b); }
inline Tensor operator!=(const Tensor& a, Scalar b) { return not_equal(a, b); }
inline Tensor operator<(const Tensor& a, Scalar b) { return less(a, b); }
inline Tensor operator<=(const Tensor& a, Scalar b) { return less_equal(a, b); }
inline Tensor operator>(const Tensor& a, Scalar b) { return greater(a, b); }
inline Tensor operator>=(const Tensor& a, Scalar b) { return greater_equal(a, b); }
inline Tensor operator==(Scalar a, const Tensor& b) { return equal(b, a); }
inline Tensor operator!=(Scalar a, const Tensor& b) { return not_equal(b, a); }
inline Tensor operator<(Scalar a, const Tensor& b) { return greater(b, a); }
inline Tensor operator<=(Scalar a, const Tensor& b) { return greater_equal(b, a); }
inline Tensor operator>(Scalar a, const Tensor& b) { return less(b, a); }
inline Tensor operator>=(Scalar a, const Tensor& b) { return less_equal(b, a); }
inline Tensor& operator+=(Tensor& a, const Tensor& b) { return a = add(a, b); }
inline Tensor& operator-=(Tensor& a, const Tensor& b) { return a = subtract(a, b); }
inline Tensor& operator*=(Tensor& a, const Tensor& b) { return a = multiply(a, b); }
inline Tensor& operator/=(Tensor& a, const Tensor& b) { return a = divide(a, b); }
inline Tensor& operator+=(Tensor& a, Scalar b) { return a = add(a, b); }
inline Tensor& operator-=(Tensor& a, Scalar b) { return a = subtract(a, b); }
inline Tensor& operator*=(Tensor& a, Scalar b) { return a = multiply(a, b); }
inline Tensor& operator/=(Tensor& a, Scalar b) { return a = divide(a, b); }
//@}

// ---- reductions: axis = std::nullopt reduces everything; negative axes count from the end

// jnp.sum; sums of integers are int64.
Tensor sum(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// jnp.mean; integer inputs give floats.
Tensor mean(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// jnp.max: the largest element.
Tensor max(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// jnp.min: the smallest element.
Tensor min(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// jnp.argmax: the index of the largest element, as int64.
Tensor argmax(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// jax.nn.log_softmax along `axis`.
Tensor log_softmax(const Tensor& x, int axis = -1);
// jax.nn.softmax along `axis`.
Tensor softmax(const Tensor& x, int axis = -1);

// ---- linear algebra

// The precision of a matmul whose call does not choose one (jax.default_matmul_precision):
// MESHRT_MATMUL_PRECISION (highest or tf32) until set; highest when neither says. Process-wide.
// A value_and_grad backward pass multiplies at its forward product's precision; jit records
// the precision in effect when it traces.
void set_default_matmul_precision(Precision precision);
Precision default_matmul_precision();  // the default now (see above)
// Options of matmul, matmul_transposed and dot: `precision` (see core/dtype.h) overrides the
// default for this call (tf32 changes only float32 products, on platforms with tensor cores).
struct MatmulOptions {
  std::optional<Precision> precision;  // unset: default_matmul_precision()
};
// 2-D, batched (leading dims broadcast) and 1-D operands as jnp.matmul; floats go to a BLAS.
Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& options = {});
// matmul with a and/or b read transposed in their last two dims, without copying them:
// matmul_transposed(a, b, true, false) equals matmul(a with its last two dims swapped, b), as
// jax.lax.dot_general with the contracting dims swapped (what the backward pass of a matmul
// needs). A transposed operand is at least 2-D; batch dims broadcast as in matmul.
Tensor matmul_transposed(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                         const MatmulOptions& options = {});
// jnp.dot for 1-D and 2-D operands, and N-D . 1-D.
Tensor dot(const Tensor& a, const Tensor& b, const MatmulOptions& options = {});
// Any permutation; empty reverses the dimensions.
Tensor transpose(const Tensor& x, std::vector<int> perm = {});

// ---- shape

Tensor reshape(const Tensor& x, Shape shape);  // one entry may be -1; shares the buffer
// lax.slice: [start, limit) with optional strides per dimension.
Tensor slice(const Tensor& x, const Shape& start, const Shape& limit, const Shape& strides = {});
// lax.slice_in_dim: [start, limit) with `stride` along `axis` only.
Tensor slice_in_dim(const Tensor& x, int64_t start, int64_t limit, int64_t stride = 1,
                    int axis = 0);
// lax.dynamic_slice_in_dim: `start` known at run time, clamped so the slice fits.
Tensor dynamic_slice_in_dim(const Tensor& x, int64_t start, int64_t size, int axis = 0);
// lax.dynamic_update_slice: starts clamped so the update fits.
Tensor dynamic_update_slice(const Tensor& x, const Tensor& update, const Shape& starts);
Tensor concatenate(const std::vector<Tensor>& xs, int axis = 0);  // jnp.concatenate along `axis`
std::vector<Tensor> split(const Tensor& x, int64_t sections, int axis = 0);  // equal parts
Tensor stack(const std::vector<Tensor>& xs, int axis = 0);    // jnp.stack: a new dim at `axis`
Tensor squeeze(const Tensor& x, std::vector<int> axes = {});  // empty: every size-1 dim
Tensor expand_dims(const Tensor& x, int axis);  // a size-1 dim at `axis`; shares the buffer
// jnp.pad(mode="constant"): (before, after) >= 0 per dimension.
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& widths,
           double value = 0.0);
// x[i] (Tensor::operator[]): row i of the leading dimension, negative counts from the end; a view
// sharing x's block.
Tensor row(const Tensor& x, int64_t i);

// The dtype JAX gives `a op b` for two arrays; and the float type of integer math.
DType promote_types(DType a, DType b);
DType float_dtype_for(DType x);  // f32 -> f32, f64 -> f64, i32/bool -> f32, i64 -> f64

}  // namespace meshrt
