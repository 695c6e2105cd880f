// backends/scalar_ops.h: the element semantics every platform's kernels share (XLA's): integer
// arithmetic wraps, max/min propagate NaN, argmax keeps the first maximum and stops at a NaN.
// Host and device code (CUDA) include this one definition, so cpu and cuda agree bit for bit
// wherever the math library does; bfloat16/float16 (core/half.h, host and device) compute each
// result in float and round it once, on both.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/op_codes.h"
#include "core/dtype.h"
#include "core/error.h"

#if defined(__CUDACC__)
#define MESHRT_HD __host__ __device__ __forceinline__
#else
#define MESHRT_HD inline
#endif

namespace meshrt::backend::scalar {

// Calls f with a value of the element type of `t` (host code: kernel dispatch). The 16-bit floats
// are not among them: a platform whose kernels dispatch here has no bf16/f16 kernels, and says so
// (visit_any_dtype below includes them, for platforms that have).
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::bf16:
    case DType::f16:
      throw Error(std::string("[backend] ") + std::string(dtype_name(t)) +
                  " has no kernel on this platform yet (it has float32, float64, int32, int64 and "
                  "bool); astype to float32 first, or run on the cpu platform");
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::bool_:
      break;
  }
  return f(bool{});
}

// visit_dtype with bfloat16 and float16 too (host code: the cpu and cuda kernels' dispatch).
template <class F>
decltype(auto) visit_any_dtype(DType t, F&& f) {
  if (t == DType::bf16) return f(bfloat16{});
  if (t == DType::f16) return f(float16{});
  return visit_dtype(t, std::forward<F>(f));
}

// Floating-point element types: float, double, bfloat16, float16.
template <class T>
inline constexpr bool is_float_v = std::is_floating_point_v<T> || is_half_v<T>;

// Integers wrap (two's complement) without signed-overflow UB.
template <class T>
MESHRT_HD T wrap_add(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a || b;  // NumPy: bool + bool is logical or
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class T>
MESHRT_HD T wrap_sub(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a != b;  // unreachable: the runtime rejects bool subtraction, as NumPy does
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <class T>
MESHRT_HD T wrap_mul(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a && b;  // NumPy: bool * bool is logical and
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}
// astype's element conversion, as XLA's: floats to integers truncate toward zero, NaN gives 0
// and values beyond the integer range saturate at its ends (a plain cast is undefined there,
// and x86 gives INT_MIN); everything else is the C++ conversion (to bool: x != 0).
template <class O, class I>
MESHRT_HD O convert(I v) {
  if constexpr (is_half_v<I> && is_half_v<O>) {
    return O(static_cast<float>(v));  // exact into float, rounded once
  } else if constexpr (std::is_same_v<I, bfloat16> && std::is_same_v<O, double>) {
    // XLA's cpu widens through float with denormals flushed: a subnormal bfloat16 gives ±0.
    return (v.bits() & 0x7f80u) == 0 ? ((v.bits() & 0x8000u) ? -0.0 : 0.0)
                                     : static_cast<double>(static_cast<float>(v));
  } else if constexpr (is_half_v<I>) {
    return convert<O>(static_cast<float>(v));
  } else if constexpr (is_half_v<O>) {
    return O(v);  // doubles and integers through float first, as JAX (core/half.h)
  } else if constexpr (std::is_floating_point_v<I> && std::is_integral_v<O> &&
                       !std::is_same_v<O, bool>) {
    constexpr O kMax = static_cast<O>(~std::make_unsigned_t<O>{0} >> 1);
    constexpr O kMin = static_cast<O>(-kMax - 1);
    if (v != v) return O(0);
    // -2^k is exact in every float type; (I)kMax rounds up to 2^k where I has fewer bits, and
    // anything at or above it saturates (for double -> int32 it is exact and saturates too).
    if (v <= static_cast<I>(kMin)) return kMin;
    if (v >= static_cast<I>(kMax)) return kMax;
    return static_cast<O>(v);
  } else {
    return static_cast<O>(v);
  }
}

// max/min propagate NaN, as XLA's.
template <class T>
MESHRT_HD T max_nan(T a, T b) {
  if constexpr (is_float_v<T>)
    return (a > b || a != a) ? a : b;
  else
    return a > b ? a : b;
}
template <class T>
MESHRT_HD T min_nan(T a, T b) {
  if constexpr (is_float_v<T>)
    return (a < b || a != a) ? a : b;
  else
    return a < b ? a : b;
}
// Collective pmax/pmin folds (XLA's CPU all-reduce, checked against JAX): std::max/std::min's
// comparisons, so a NaN met as the second operand is dropped (pmax of 1, NaN, 5 is 5).
template <class T>
MESHRT_HD T fold_max(T a, T b) {
  return (a < b) ? b : a;
}
template <class T>
MESHRT_HD T fold_min(T a, T b) {
  return (b < a) ? b : a;
}
// argmax: does v at a later index replace the best so far? (first maximum; a NaN wins and stays)
template <class T>
MESHRT_HD bool argmax_better(T best, T v) {
  if constexpr (is_float_v<T>)
    return (best == best) && (v > best || v != v);
  else
    return v > best;
}

// The unary ops of backend::UnaryOp other than copy, by number (neg=1 ... relu=8), checked
// against backends/op_codes.h below.
enum UnaryCode : int { kNeg = 1, kExp, kLog, kSin, kCos, kTanh, kSqrt, kRelu };
static_assert(kNeg == code(UnaryOp::neg) && kExp == code(UnaryOp::exp) &&
                  kLog == code(UnaryOp::log) && kSin == code(UnaryOp::sin) &&
                  kCos == code(UnaryOp::cos) && kTanh == code(UnaryOp::tanh) &&
                  kSqrt == code(UnaryOp::sqrt) && kRelu == code(UnaryOp::relu),
              "scalar_ops.h's unary codes are backends/op_codes.h's UnaryOp");

template <class T>
MESHRT_HD T unary(int op, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v;
  } else if constexpr (is_half_v<T>) {
    return T(unary(op, static_cast<float>(v)));  // in float, rounded once
  } else if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case kNeg:
        return -v;
      case kExp:
        return std::exp(v);
      case kLog:
        return std::log(v);
      case kSin:
        return std::sin(v);
      case kCos:
        return std::cos(v);
      case kTanh:
        return std::tanh(v);
      case kSqrt:
        return std::sqrt(v);
      case kRelu:
        return v > T(0) ? v : (v != v ? v : T(0));
      default:
        return v;
    }
  } else {
    switch (op) {
      case kNeg:
        return wrap_sub(T(0), v);
      case kRelu:
        return v > 0 ? v : T(0);
      default:
        return v;
    }
  }
}

}  // namespace meshrt::backend::scalar
