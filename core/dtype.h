// core/dtype.h: element types and shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/half.h"

namespace meshrt {

// Element type of a Tensor or Array. Names follow NumPy/JAX (float32, ..., bool). bool_ is what
// comparisons return (one byte per element, 0 or 1). bf16 (bfloat16) and f16 (float16) store 16
// bits and compute in float32 (core/half.h); they come last so the older values keep their numbers.
enum class DType {
  f32,    // float32
  f64,    // float64
  i32,    // int32
  i64,    // int64
  bool_,  // bool
  bf16,   // bfloat16 (meshrt::bfloat16)
  f16,    // float16 (meshrt::float16)
};

// The DType of a C++ element type: dtype_of<float>::value is DType::f32. Specialized for float,
// double, bfloat16, float16, int32_t, int64_t and bool; any other type fails to compile with a
// message.
template <class T>
struct dtype_of {
  static_assert(
      !std::is_same_v<T, T>,
      "meshrt supports float, double, bfloat16, float16, int32_t, int64_t and bool elements only");
};
// float is float32.
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;  // the DType
};
// double is float64.
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;  // the DType
};
// meshrt::bfloat16 is bf16.
template <>
struct dtype_of<bfloat16> {
  static constexpr DType value = DType::bf16;  // the DType
};
// meshrt::float16 is f16.
template <>
struct dtype_of<float16> {
  static constexpr DType value = DType::f16;  // the DType
};
// int32_t is int32.
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;  // the DType
};
// int64_t is int64.
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;  // the DType
};
// bool is bool_ (stored as one byte).
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::bool_;  // the DType
};

// dtype_v<float> == DType::f32; any other element type is a compile-time error.
template <class T>
inline constexpr DType dtype_v = dtype_of<std::remove_cv_t<T>>::value;

// Size of one element in bytes.
size_t dtype_size(DType dtype);
// "float32", "float64", "int32", "int64", "bool", "bfloat16", "float16".
std::string_view dtype_name(DType dtype);
// Prints dtype_name(): "float32".
inline std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

// Matmul precision (jax.lax.Precision, jax.default_matmul_precision): `highest` multiplies f32 in
// true fp32 (f64 in f64); `tf32` lets a GPU with tensor cores round f32 operands to TF32 (8-bit
// exponent, 10-bit mantissa) and accumulate in f32, as JAX does on GPUs by default. cpu computes
// in full precision whatever is asked. set_default_matmul_precision (runtime/tensor_ops.h) and
// MESHRT_MATMUL_PRECISION choose the default; matmul/dot options choose per call.
enum class Precision {
  highest,  // true fp32 products for f32 (JAX's Precision.HIGHEST)
  tf32,     // f32 operands may be rounded to TF32 on GPUs with tensor cores
};
// "highest" or "tf32" (the values of MESHRT_MATMUL_PRECISION).
std::string_view precision_name(Precision p);
// The C++ element type name, for error messages: "float", "double", "int32_t", "int64_t", "bool",
// "meshrt::bfloat16", "meshrt::float16".
std::string_view dtype_cpp_name(DType dtype);

// A row-major array shape. Every entry is >= 0.
using Shape = std::vector<int64_t>;

// Number of elements (1 for rank 0).
int64_t shape_size(const Shape& shape);
// True for f32, f64, bf16 and f16.
bool is_floating(DType dtype);
// True for bf16 and f16 (16-bit floats that compute in float32).
inline bool is_half(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }
// Python tuple notation, as JAX prints shapes: "(8, 4)", "(10,)", "()".
std::string shape_str(const Shape& shape);

namespace detail {
// Nested-bracket text of shape_size(shape) elements of `dtype` at host address `data`, as NumPy
// prints them ("[[0., 1.5], [2., 3.]]", "7", "[true, false]"); floats in their shortest form.
std::string values_str(const void* data, DType dtype, const Shape& shape);
// How many elements operator<< of a Tensor or Array prints values for (larger ones print their
// dtype, shape and sharding only).
inline constexpr int64_t kMaxPrintedElements = 100;

// Reads n elements of T to the host through copy(void* dst, DType expected). std::vector<bool>
// has no data(), so bool goes through bytes.
template <class T, class Copy>
std::vector<T> read_to_host(int64_t n, Copy&& copy) {
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n));
    copy(bytes.data(), DType::bool_);
    return std::vector<bool>(bytes.begin(), bytes.end());
  } else {
    std::vector<T> out(static_cast<size_t>(n));
    copy(out.data(), dtype_v<T>);
    return out;
  }
}
}  // namespace detail

}  // namespace meshrt
