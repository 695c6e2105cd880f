// core/half.h: the 16-bit floating-point element types, bfloat16 and float16 (IEEE binary16).
//
// Both store 16 bits and compute in float: every arithmetic operator converts its operands to
// float, computes there and rounds the result once (what XLA's cpu backend does for these types).
// Conversions follow JAX (ml_dtypes / XLA, checked against JAX 0.10.2): from float they round to
// nearest, ties to even; from double and from integers they go through float first (as JAX does,
// so a double can round twice); float16 overflows to ±Inf and keeps subnormals; NaN stays NaN
// (bfloat16 gives the canonical quiet NaN with the input's sign, float16 keeps the payload's top
// bits and sets the quiet bit, as XLA). Conversions to float are exact (a float16 NaN comes back
// quiet, as XLA's).
//
// Written in C++17 (no std::bit_cast) and callable from CUDA device code (MESHRT_HALF_HD): the cuda
// kernels (backends/cuda/cuda_kernels.cu) convert with these very functions, so both platforms give
// the same bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

// Host and device under nvcc, host only elsewhere.
#if defined(__CUDACC__)
#define MESHRT_HALF_HD __host__ __device__ __forceinline__
#else
#define MESHRT_HALF_HD inline
#endif

namespace meshrt {

namespace detail {
MESHRT_HALF_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
MESHRT_HALF_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
MESHRT_HALF_HD uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16 & 0x8000u) | 0x7fc0u);
  // Round to nearest even on the 16 bits dropped; a carry into the exponent gives Inf correctly.
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}
MESHRT_HALF_HD float bf16_bits_to_f32(uint16_t b) {
  return f32_from_bits(static_cast<uint32_t>(b) << 16);
}
MESHRT_HALF_HD uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a & 0x7fffffu) >> 13));
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536 (and Inf)
  if (a < 0x38800000u) {
    // Below float16's smallest normal (2^-14): a subnormal, in units of 2^-24, rounded to even.
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
    const uint32_t e = a >> 23;                               // 102 .. 112
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // value = m * 2^(e - 150); in units of 2^-24: m >> (126 - e)
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias the exponent (127 -> 15), round the 13 dropped bits to even (a carry rolls
  // into the exponent, up to Inf for values at or above 65520).
  const uint32_t lsb = (a >> 13) & 1u;
  const uint32_t r = (a - 0x38000000u + 0xfffu + lsb) >> 13;
  return static_cast<uint16_t>(sign | r);
}
MESHRT_HALF_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return f32_from_bits(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e != 0) return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
  // Zero or subnormal: m * 2^-24 is exact in float.
  const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

// The operations both types share, on a derived type D with a `bits_` member and conversions.
template <class D>
struct HalfOps {
  MESHRT_HALF_HD friend D operator+(D a, D b) {
    return D(static_cast<float>(a) + static_cast<float>(b));
  }
  MESHRT_HALF_HD friend D operator-(D a, D b) {
    return D(static_cast<float>(a) - static_cast<float>(b));
  }
  MESHRT_HALF_HD friend D operator*(D a, D b) {
    return D(static_cast<float>(a) * static_cast<float>(b));
  }
  MESHRT_HALF_HD friend D operator/(D a, D b) {
    return D(static_cast<float>(a) / static_cast<float>(b));
  }
  MESHRT_HALF_HD friend D operator-(D a) {
    return D::from_bits(static_cast<uint16_t>(a.bits() ^ 0x8000u));
  }
  MESHRT_HALF_HD friend D& operator+=(D& a, D b) { return a = a + b; }
  MESHRT_HALF_HD friend D& operator-=(D& a, D b) { return a = a - b; }
  MESHRT_HALF_HD friend D& operator*=(D& a, D b) { return a = a * b; }
  MESHRT_HALF_HD friend D& operator/=(D& a, D b) { return a = a / b; }
  // Comparisons are float's: NaN compares unequal to everything, -0 == +0.
  MESHRT_HALF_HD friend bool operator==(D a, D b) {
    return static_cast<float>(a) == static_cast<float>(b);
  }
  MESHRT_HALF_HD friend bool operator!=(D a, D b) {
    return static_cast<float>(a) != static_cast<float>(b);
  }
  MESHRT_HALF_HD friend bool operator<(D a, D b) {
    return static_cast<float>(a) < static_cast<float>(b);
  }
  MESHRT_HALF_HD friend bool operator<=(D a, D b) {
    return static_cast<float>(a) <= static_cast<float>(b);
  }
  MESHRT_HALF_HD friend bool operator>(D a, D b) {
    return static_cast<float>(a) > static_cast<float>(b);
  }
  MESHRT_HALF_HD friend bool operator>=(D a, D b) {
    return static_cast<float>(a) >= static_cast<float>(b);
  }
};
}  // namespace detail

// bfloat16: 1 sign bit, 8 exponent bits (float's range), 7 mantissa bits. A trivially copyable
// value type of 2 bytes; `bfloat16(1.5f)`, `static_cast<float>(b)`, `b.bits()`.
class bfloat16 : public detail::HalfOps<bfloat16> {
 public:
  bfloat16() = default;
  // Rounds f to nearest, ties to even.
  MESHRT_HALF_HD explicit bfloat16(float f) : bits_(detail::f32_to_bf16_bits(f)) {}
  // Through float first, as JAX (d can round twice).
  MESHRT_HALF_HD explicit bfloat16(double d) : bfloat16(static_cast<float>(d)) {}
  // An integer, through float first, as JAX.
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  MESHRT_HALF_HD explicit bfloat16(I i) : bfloat16(static_cast<float>(i)) {}
  // The exact value as float.
  MESHRT_HALF_HD explicit operator float() const { return detail::bf16_bits_to_f32(bits_); }
  // The exact value as double.
  MESHRT_HALF_HD explicit operator double() const {
    return static_cast<double>(static_cast<float>(*this));
  }
  // The value whose 16 bits are b.
  MESHRT_HALF_HD static bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits_ = b;
    return h;
  }
  // The 16 bits as stored.
  MESHRT_HALF_HD uint16_t bits() const { return bits_; }

 private:
  uint16_t bits_ = 0;
};

// float16 (IEEE 754 binary16): 1 sign bit, 5 exponent bits, 10 mantissa bits; largest finite
// value 65504, smallest subnormal 2^-24. Same interface as bfloat16.
class float16 : public detail::HalfOps<float16> {
 public:
  float16() = default;
  // Rounds f to nearest, ties to even.
  MESHRT_HALF_HD explicit float16(float f) : bits_(detail::f32_to_f16_bits(f)) {}
  // Through float first, as JAX (d can round twice).
  MESHRT_HALF_HD explicit float16(double d) : float16(static_cast<float>(d)) {}
  // An integer, through float first, as JAX.
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  MESHRT_HALF_HD explicit float16(I i) : float16(static_cast<float>(i)) {}
  // The exact value as float.
  MESHRT_HALF_HD explicit operator float() const { return detail::f16_bits_to_f32(bits_); }
  // The exact value as double.
  MESHRT_HALF_HD explicit operator double() const {
    return static_cast<double>(static_cast<float>(*this));
  }
  // The value whose 16 bits are b.
  MESHRT_HALF_HD static float16 from_bits(uint16_t b) {
    float16 h;
    h.bits_ = b;
    return h;
  }
  // The 16 bits as stored.
  MESHRT_HALF_HD uint16_t bits() const { return bits_; }

 private:
  uint16_t bits_ = 0;
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16>);

// True for bfloat16 and float16 (the types that compute in float and store 16 bits).
template <class T>
inline constexpr bool is_half_v =
    std::is_same_v<std::remove_cv_t<T>, bfloat16> || std::is_same_v<std::remove_cv_t<T>, float16>;

}  // namespace meshrt
