// meshrt/array_ops.h: every Tensor op on global Arrays (JAX's "automatic parallelism").
//
//   Array y = 2.0 * sin(x) + 1.0;     // runs on every device holding a block of x; stays sharded
//   Array s0 = sum(x, 0);              // x sharded on dim 0: a pending sum, replicated once read
//   Array c = with_sharding_constraint(sum(x, 0), NamedSharding(mesh, P("x")));  // psum_scatter
//
// Names, broadcasting, dtype promotion and values are those of the Tensor ops (tensor_ops.h).
// Each op computes per device on the blocks it holds; the result's sharding is the one jax.jit
// gives for that single op on Auto mesh axes (global/rules.cpp has the rules, as one table).
// Where operands' shardings conflict, meshrt reshards the cheaper operands to the sharding of
// the one with the most elements instead of replicating everything as jax.jit does (values are
// JAX's). Every collective an op inserts is recorded in the CollectiveLog; in
// ShardingMode::explicit_ an implicit reshard is an Error instead.
//
// Sums stay pending while only linear ops follow (+, -, negation, scalar * and /, transpose,
// reshape, further sums): with_sharding_constraint to a sharded spec then costs one
// psum_scatter, and reading the value one psum. All operands of an op live on one mesh.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "global/collective_log.h"
#include "global/sharding_mode.h"
#include "runtime/array.h"
#include "runtime/tensor_ops.h"

namespace meshrt {

// Options of ops that can be told their result's sharding (JAX's out_sharding=).
struct OpOptions {
  std::optional<Sharding> out_sharding;  // unset: the op's placement rule decides
  // The product's precision (default_matmul_precision() when unset; see core/dtype.h).
  std::optional<Precision> precision;
};

// ---- creation on a sharding (each device fills its own block)

Array zeros(Shape shape, DType dtype, const Sharding& sharding);  // jnp.zeros placed by `sharding`
Array ones(Shape shape, DType dtype, const Sharding& sharding);   // jnp.ones placed by `sharding`
// jnp.full placed by `sharding`: every element `value`, cast to dtype.
Array full(Shape shape, double value, DType dtype, const Sharding& sharding);
Array arange(int64_t n, DType dtype, const Sharding& sharding);  // 0, 1, ..., n-1 by `sharding`
Array astype(const Array& x, DType dtype);  // x.astype(dtype); keeps the sharding

// ---- resharding

// jax.lax.with_sharding_constraint: the value resharded to `sharding` (pending sums summed with
// psum_scatter where the spec shards them). A spec that does not divide the shape is not an
// error: as jax.jit does, the axes that do not divide are dropped (the CollectiveLog says so).
Array with_sharding_constraint(const Array& x, const Sharding& sharding);

// ---- elementwise (broadcasting)

Array add(const Array& a, const Array& b);                       // a + b
Array subtract(const Array& a, const Array& b);                  // a - b
Array multiply(const Array& a, const Array& b);                  // a * b
Array divide(const Array& a, const Array& b);                    // a / b, true division
Array maximum(const Array& a, const Array& b);                   // NaN propagates
Array minimum(const Array& a, const Array& b);                   // NaN propagates
Array equal(const Array& a, const Array& b);                     // a == b; comparisons give bool
Array not_equal(const Array& a, const Array& b);                 // a != b
Array less(const Array& a, const Array& b);                      // a < b
Array less_equal(const Array& a, const Array& b);                // a <= b
Array greater(const Array& a, const Array& b);                   // a > b
Array greater_equal(const Array& a, const Array& b);             // a >= b
Array where(const Array& cond, const Array& a, const Array& b);  // cond is bool

Array neg(const Array& x);   // -x
Array exp(const Array& x);   // integer inputs give floats
Array log(const Array& x);   // natural logarithm; integer inputs give floats
Array sin(const Array& x);   // integer inputs give floats
Array cos(const Array& x);   // integer inputs give floats
Array tanh(const Array& x);  // integer inputs give floats
Array sqrt(const Array& x);  // integer inputs give floats
Array relu(const Array& x);  // max(x, 0), jax.nn.relu

// One expression `relu(matmul(x, W) + b)` (or `matmul(x, W) + b`, `b + matmul(x, W)`): where the
// platform fuses a product's epilogue (cuda with MESHRT_CUDA_MATMUL=lt), a float32 product of two
// matrices in plain eager code (no value_and_grad or jit tracing) waits for the expression's next
// ops, and these overloads, taking the temporaries, join a row bias ((n,) or (1, n), float32) and
// then relu to it: the layer runs as one call per device (cuBLASLt's BIAS / RELU_BIAS epilogue)
// when something first reads it, with the unfused ops' bits. A named product (`Array h =
// matmul(x, W); relu(h + b)`) runs on its own, as every product does on other platforms. Values,
// shardings, errors and the CollectiveLog are those of the ops one by one. jit fuses the same
// pattern in its compiled steps (see jit.h).
Array add(Array&& a, const Array& b);
Array add(const Array& a, Array&& b);
Array add(Array&& a, Array&& b);
Array relu(Array&& x);

Array add(const Array& a, Scalar b);            // a + b
Array subtract(const Array& a, Scalar b);       // a - b
Array subtract(Scalar a, const Array& b);       // a - b
Array multiply(const Array& a, Scalar b);       // a * b
Array divide(const Array& a, Scalar b);         // a / b, true division
Array divide(Scalar a, const Array& b);         // a / b, true division
Array maximum(const Array& a, Scalar b);        // NaN propagates
Array minimum(const Array& a, Scalar b);        // NaN propagates
Array equal(const Array& a, Scalar b);          // a == b; bool results
Array not_equal(const Array& a, Scalar b);      // a != b
Array less(const Array& a, Scalar b);           // a < b
Array less_equal(const Array& a, Scalar b);     // a <= b
Array greater(const Array& a, Scalar b);        // a > b
Array greater_equal(const Array& a, Scalar b);  // a >= b

// Operators, as on Tensors: `a + b` is add(a, b), `a - b` subtract, `a * b` multiply, `a / b`
// divide, `-x` neg(x), and `==`, `!=`, `<`, `<=`, `>`, `>=` the comparisons (bool results); a
// Scalar may stand on either side. `a += b` (and -=, *=, /=) rebinds `a` to the new Array.
//@{
inline Array operator+(const Array& a, const Array& b) { return add(a, b); }
inline Array operator+(Array&& a, const Array& b) { return add(std::move(a), b); }
inline Array operator+(const Array& a, Array&& b) { return add(a, std::move(b)); }
inline Array operator+(Array&& a, Array&& b) { return add(std::move(a), std::move(b)); }
inline Array operator-(const Array& a, const Array& b) { return subtract(a, b); }
inline Array operator*(const Array& a, const Array& b) { return multiply(a, b); }
inline Array operator/(const Array& a, const Array& b) { return divide(a, b); }
inline Array operator-(const Array& x) { return neg(x); }
inline Array operator+(const Array& a, Scalar b) { return add(a, b); }
inline Array operator+(Scalar a, const Array& b) { return add(b, a); }
inline Array operator-(const Array& a, Scalar b) { return subtract(a, b); }
inline Array operator-(Scalar a, const Array& b) { return subtract(a, b); }
inline Array operator*(const Array& a, Scalar b) { return multiply(a, b); }
inline Array operator*(Scalar a, const Array& b) { return multiply(b, a); }
inline Array operator/(const Array& a, Scalar b) { return divide(a, b); }
inline Array operator/(Scalar a, const Array& b) { return divide(a, b); }
inline Array operator==(const Array& a, const Array& b) { return equal(a, b); }
inline Array operator!=(const Array& a, const Array& b) { return not_equal(a, b); }
inline Array operator<(const Array& a, const Array& b) { return less(a, b); }
inline Array operator<=(const Array& a, const Array& b) { return less_equal(a, b); }
inline Array operator>(const Array& a, const Array& b) { return greater(a, b); }
inline Array operator>=(const Array& a, const Array& b) { return greater_equal(a, b); }
inline Array operator==(const Array& a, Scalar b) { return equal(a, b); }
inline Array operator!=(const Array& a, Scalar b) { return not_equal(a, b); }
inline Array operator<(const Array& a, Scalar b) { return less(a, b); }
inline Array operator<=(const Array& a, Scalar b) { return less_equal(a, b); }
inline Array operator>(const Array& a, Scalar b) { return greater(a, b); }
inline Array operator>=(const Array& a, Scalar b) { return greater_equal(a, b); }
inline Array& operator+=(Array& a, const Array& b) { return a = add(a, b); }
inline Array& operator-=(Array& a, const Array& b) { return a = subtract(a, b); }
inline Array& operator*=(Array& a, const Array& b) { return a = multiply(a, b); }
inline Array& operator/=(Array& a, const Array& b) { return a = divide(a, b); }
inline Array& operator+=(Array& a, Scalar b) { return a = add(a, b); }
inline Array& operator-=(Array& a, Scalar b) { return a = subtract(a, b); }
inline Array& operator*=(Array& a, Scalar b) { return a = multiply(a, b); }
inline Array& operator/=(Array& a, Scalar b) { return a = divide(a, b); }
//@}

// ---- reductions: axis = std::nullopt reduces everything; negative axes count from the end

// jnp.sum; sums of integers are int64. Over a sharded dim the result is a pending sum
// (see the file comment).
Array sum(const Array& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// jnp.mean; integer inputs give floats.
Array mean(const Array& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// jnp.max: the largest element (a pmax over the axes sharding the reduced dims).
Array max(const Array& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// jnp.min: the smallest element (a pmin over the axes sharding the reduced dims).
Array min(const Array& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// jnp.argmax: the index of the largest element, as int64.
Array argmax(const Array& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
Array softmax(const Array& x, int axis = -1);      // jax.nn.softmax along `axis`
Array log_softmax(const Array& x, int axis = -1);  // jax.nn.log_softmax along `axis`

// ---- linear algebra

// jnp.matmul (2-D, batched and 1-D operands); contracting a sharded dim gives a pending sum.
// options: out_sharding constrains the result, precision the product's.
Array matmul(const Array& a, const Array& b, const OpOptions& options = {});
// matmul with a and/or b read transposed in their last two dims, without a transpose op: the
// placement rule sees the swapped operand (as jax.jit would for dot_general's swapped dims).
Array matmul_transposed(const Array& a, const Array& b, bool transpose_a, bool transpose_b,
                        const OpOptions& options = {});
// jnp.dot for 1-D and 2-D operands, and N-D . 1-D.
Array dot(const Array& a, const Array& b, const OpOptions& options = {});
Array transpose(const Array& x, std::vector<int> perm = {});  // empty perm reverses the dims

// ---- shape

Array reshape(const Array& x, Shape shape);  // one entry may be -1
// lax.slice: [start, limit) with optional strides per dimension.
Array slice(const Array& x, const Shape& start, const Shape& limit, const Shape& strides = {});
// lax.slice_in_dim: [start, limit) with `stride` along `axis` only.
Array slice_in_dim(const Array& x, int64_t start, int64_t limit, int64_t stride = 1, int axis = 0);
// lax.dynamic_slice_in_dim: `start` clamped so the slice fits.
Array dynamic_slice_in_dim(const Array& x, int64_t start, int64_t size, int axis = 0);
Array concatenate(const std::vector<Array>& xs, int axis = 0);  // jnp.concatenate along `axis`
std::vector<Array> split(const Array& x, int64_t sections, int axis = 0);  // equal parts
Array stack(const std::vector<Array>& xs, int axis = 0);    // jnp.stack: a new dim at `axis`
Array squeeze(const Array& x, std::vector<int> axes = {});  // empty: every size-1 dim
Array expand_dims(const Array& x, int axis);                // a size-1 dim at `axis`
// jnp.pad(mode="constant"): (before, after) >= 0 per dimension.
Array pad(const Array& x, const std::vector<std::pair<int64_t, int64_t>>& widths,
          double value = 0.0);
// x[i]: row i of the leading dimension (negative counts from the end), as jnp indexing.
Array row(const Array& x, int64_t i);

}  // namespace meshrt
