#include "backends/cpu/coll_primitives.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backends/scalar_ops.h"
#include "core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace meshrt::cpu {

namespace {

using backend::FoldOp;
using backend::scalar::fold_max;
using backend::scalar::fold_min;
using backend::scalar::wrap_add;

// dst = f(...f(f(s0, s1), s2)..., s_{n-1}); the first inputs combine straight into dst. Up to four
// inputs per pass over dst, so dst is loaded and stored once per four inputs rather than once
// per input (a small psum over 256 devices folds 256 inputs into one 4 KiB output): the same
// combinations in the same order for every element, so the same bits.
template <class T, class F>
void fold_with(T* __restrict dst, const std::vector<const void*>& srcs, int64_t len, F f) {
  const size_t n = srcs.size();
  auto in = [&](size_t j) { return static_cast<const T*>(srcs[j]); };
  const T* s0 = in(0);
  if (n == 1) {
    std::copy(s0, s0 + len, dst);
    return;
  }
  const T* s1 = in(1);
  size_t j = std::min<size_t>(n, 4);
  if (j == 4) {
    const T *s2 = in(2), *s3 = in(3);
#pragma omp simd
    for (int64_t e = 0; e < len; ++e) dst[e] = f(f(f(s0[e], s1[e]), s2[e]), s3[e]);
  } else if (j == 3) {
    const T* s2 = in(2);
#pragma omp simd
    for (int64_t e = 0; e < len; ++e) dst[e] = f(f(s0[e], s1[e]), s2[e]);
  } else {
#pragma omp simd
    for (int64_t e = 0; e < len; ++e) dst[e] = f(s0[e], s1[e]);
  }
  for (; j + 4 <= n; j += 4) {
    const T *a = in(j), *b = in(j + 1), *c = in(j + 2), *d = in(j + 3);
#pragma omp simd
    for (int64_t e = 0; e < len; ++e) dst[e] = f(f(f(f(dst[e], a[e]), b[e]), c[e]), d[e]);
  }
  for (; j < n; ++j) {
    const T* s = in(j);
#pragma omp simd
    for (int64_t e = 0; e < len; ++e) dst[e] = f(dst[e], s[e]);
  }
}

template <class T>
void fold_typed(FoldOp op, T* dst, const std::vector<const void*>& srcs, int64_t len) {
  switch (op) {
    case FoldOp::max:
      return fold_with<T>(dst, srcs, len, [](T a, T b) { return fold_max(a, b); });
    case FoldOp::min:
      return fold_with<T>(dst, srcs, len, [](T a, T b) { return fold_min(a, b); });
    default:
      return fold_with<T>(dst, srcs, len, [](T a, T b) { return wrap_add(a, b); });
  }
}

template <class T>
void fold_into(FoldOp op, DType out, void* dst, const std::vector<const void*>& srcs, int64_t len) {
  const auto n = static_cast<double>(srcs.size());
  if (op != FoldOp::mean) {
    fold_typed<T>(op, static_cast<T*>(dst), srcs, len);
    return;
  }
  if constexpr (std::is_floating_point_v<T>) {
    T* d = static_cast<T*>(dst);
    fold_typed<T>(FoldOp::sum, d, srcs, len);
    const T tn = static_cast<T>(n);
#pragma omp simd
    for (int64_t e = 0; e < len; ++e) d[e] = d[e] / tn;
  } else {
    // Integer pmean: wrap-around integer sum (as psum), then true division in the float type.
    constexpr int64_t kTile = 1024;
    T tmp[kTile];
    std::vector<const void*> part(srcs.size());
    for (int64_t base = 0; base < len; base += kTile) {
      const int64_t m = std::min(kTile, len - base);
      for (size_t j = 0; j < srcs.size(); ++j) part[j] = static_cast<const T*>(srcs[j]) + base;
      fold_typed<T>(FoldOp::sum, tmp, part, m);
      if (out == DType::f32) {
        float* d = static_cast<float*>(dst) + base;
        for (int64_t e = 0; e < m; ++e) d[e] = static_cast<float>(tmp[e]) / static_cast<float>(n);
      } else {
        double* d = static_cast<double*>(dst) + base;
        for (int64_t e = 0; e < m; ++e) d[e] = static_cast<double>(tmp[e]) / n;
      }
    }
  }
}

// ---- 16-bit folds: widen every input to float32, fold in float32, round each output once.
// The conversions are core/half.h's bit for bit, written without branches (each case computed,
// then selected) so that the compiler vectorises them; fold_half_kernel is compiled twice, for
// baseline x86-64 and for AVX2 (picked at run time), and inlines everything it calls.
#define MESHRT_FOLD_INLINE [[gnu::always_inline]] inline

MESHRT_FOLD_INLINE uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
MESHRT_FOLD_INLINE float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Element-wise widening and narrowing of whole tiles. bfloat16's are plain loops the compiler
// vectorises. float16's select among cases, and GCC will not turn a select next to a float
// operation into vector code (-ftrapping-math), so the portable ones are written on 4-lane vectors
// (GCC and Clang vector extensions: SSE2, any x86-64); under AVX2 the CPU's F16C instructions
// convert (the same bits: exact widening, rounding to nearest even, NaN made quiet with the top of
// its payload kept).
typedef uint16_t U16x4 __attribute__((vector_size(8)));
typedef uint32_t U32x4 __attribute__((vector_size(16)));
typedef int32_t I32x4 __attribute__((vector_size(16)));
typedef float F32x4 __attribute__((vector_size(16)));

// mask ? a : b, lane by lane, for a mask of all-ones or all-zeros lanes.
MESHRT_FOLD_INLINE U32x4 select(I32x4 mask, U32x4 a, U32x4 b) {
  const auto k = reinterpret_cast<U32x4>(mask);
  return (a & k) | (b & ~k);
}

// d[e] = the conversion of s[e] for m elements: four lanes at a time through `lanes` (a 4-lane
// vector of In to one of Out), the tail one element at a time through `scalar`.
template <class R, class A>
A lanes_arg(R (*)(A));  // the vector type a lane function takes (unevaluated)
template <auto lanes, auto scalar, class Out, class In>
MESHRT_FOLD_INLINE void convert_tile(Out* __restrict d, const In* __restrict s, int64_t m) {
  using InV = decltype(lanes_arg(lanes));
  static_assert(sizeof(InV) == 4 * sizeof(In));
  int64_t e = 0;
  for (; e + 4 <= m; e += 4) {
    InV v;
    std::memcpy(&v, s + e, sizeof v);
    const auto r = lanes(v);
    static_assert(sizeof r == 4 * sizeof(Out));
    std::memcpy(d + e, &r, sizeof r);
  }
  for (; e < m; ++e) d[e] = scalar(s[e]);
}

// bfloat16: the top half of a float32; rounding adds 0x7fff plus the kept lowest bit (to even),
// a NaN becomes the quiet NaN with its sign.
struct Bf16Bits {
  static constexpr bool kWidenInLoop = true;  // widen() vectorises inside the fold's loops
  MESHRT_FOLD_INLINE static float widen(uint16_t b) { return float_of(uint32_t{b} << 16); }
  MESHRT_FOLD_INLINE static uint16_t narrow(float f) {
    const uint32_t u = bits_of(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
    return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
  MESHRT_FOLD_INLINE static void widen_tile(float* __restrict d, const uint16_t* __restrict s,
                                            int64_t m) {
    for (int64_t e = 0; e < m; ++e) d[e] = widen(s[e]);
  }
  MESHRT_FOLD_INLINE static void narrow_tile(uint16_t* __restrict d, const float* __restrict s,
                                             int64_t m) {
    for (int64_t e = 0; e < m; ++e) d[e] = narrow(s[e]);
  }
};

// float16 (binary16), four lanes at a time; the tails use core/half.h's scalar functions.
struct F16Bits {
  static constexpr bool kWidenInLoop = false;  // widen_tile into a buffer, then add
  MESHRT_FOLD_INLINE static F32x4 widen_lanes(U16x4 h16) {
    const U32x4 h = __builtin_convertvector(h16, U32x4);
    const U32x4 sign = (h & 0x8000u) << 16, em = h & 0x7fffu, m = h & 0x3ffu;
    const auto emi = reinterpret_cast<I32x4>(em);
    const U32x4 normal = (em << 13) + (112u << 23);  // exponent rebiased 15 -> 127
    // Inf, or NaN made quiet.
    const U32x4 inf_nan = 0x7f800000u | (m << 13) |
                          (reinterpret_cast<U32x4>(reinterpret_cast<I32x4>(m) != 0) & 0x400000u);
    // Zero or subnormal: m * 2^-24, exact in float (no float32 subnormal is involved).
    const F32x4 small_f = __builtin_convertvector(reinterpret_cast<I32x4>(m), F32x4) * 0x1p-24f;
    const U32x4 r = select(emi < 0x400, reinterpret_cast<U32x4>(small_f),
                           select(emi >= 0x7c00, inf_nan, normal));
    return reinterpret_cast<F32x4>(r | sign);
  }
  MESHRT_FOLD_INLINE static U16x4 narrow_lanes(F32x4 f) {
    const auto u = reinterpret_cast<U32x4>(f);
    const U32x4 sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    const auto ai = reinterpret_cast<I32x4>(a);
    const U32x4 nan = 0x7e00u | ((a & 0x7fffffu) >> 13);
    // Normal: rebias, round the 13 dropped bits to even (a carry rolls up to Inf at 65520).
    const U32x4 normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    // Below 2^-14: adding 0.5 (whose ulp is 2^-24) rounds |f| to units of 2^-24, ties to even,
    // leaving their count in the low mantissa bits (up to 0x400, float16's smallest normal).
    const U32x4 sub = reinterpret_cast<U32x4>(reinterpret_cast<F32x4>(a) + 0.5f) - 0x3f000000u;
    U32x4 r = select(ai < 0x38800000, sub, normal);
    r = select(ai >= 0x47800000, U32x4{} + 0x7c00u, r);  // >= 65536 (and Inf)
    r = select(ai > 0x7f800000, nan, r);
    return __builtin_convertvector(sign | r, U16x4);
  }
  MESHRT_FOLD_INLINE static void widen_tile(float* __restrict d, const uint16_t* __restrict s,
                                            int64_t m) {
    convert_tile<widen_lanes, detail::f16_bits_to_f32>(d, s, m);
  }
  MESHRT_FOLD_INLINE static void narrow_tile(uint16_t* __restrict d, const float* __restrict s,
                                             int64_t m) {
    convert_tile<narrow_lanes, detail::f32_to_f16_bits>(d, s, m);
  }
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MESHRT_FOLD_AVX2 1
// float16 through F16C, eight lanes at a time. Not inlined into the generic fold (whose baseline
// target lacks F16C): one call per tile.
struct F16cBits {
  static constexpr bool kWidenInLoop = false;
  __attribute__((target("avx2,f16c"))) static void widen_tile(float* __restrict d,
                                                              const uint16_t* __restrict s,
                                                              int64_t m) {
    int64_t e = 0;
    for (; e + 8 <= m; e += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + e));
      _mm256_storeu_ps(d + e, _mm256_cvtph_ps(h));
    }
    for (; e < m; ++e) d[e] = detail::f16_bits_to_f32(s[e]);
  }
  __attribute__((target("avx2,f16c"))) static void narrow_tile(uint16_t* __restrict d,
                                                               const float* __restrict s,
                                                               int64_t m) {
    int64_t e = 0;
    for (; e + 8 <= m; e += 8) {
      const __m128i h =
          _mm256_cvtps_ph(_mm256_loadu_ps(s + e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + e), h);
    }
    for (; e < m; ++e) d[e] = detail::f32_to_f16_bits(s[e]);
  }
};
#endif

// Outputs per tile: the float32 accumulator (8 KiB) and up to four widened inputs stay in L1
// while the inputs stream by.
constexpr int64_t kHalfTile = 2048;

// acc[e] = (...((acc[e] + s_0[e]) + s_1[e]) ... + s_{K-1}[e]), inputs widened: K inputs per pass
// over the accumulator, the same additions in the same order as one input per pass.
template <class C, int K>
MESHRT_FOLD_INLINE void add_inputs(float* __restrict acc, const uint16_t* const* s, int64_t base,
                                   int64_t m) {
  const uint16_t* __restrict a = s[0] + base;
  const uint16_t* __restrict b = s[K > 1 ? 1 : 0] + base;
  const uint16_t* __restrict c = s[K > 2 ? 2 : 0] + base;
  const uint16_t* __restrict d = s[K > 3 ? 3 : 0] + base;
  for (int64_t e = 0; e < m; ++e) {
    float x = acc[e] + C::widen(a[e]);
    if constexpr (K > 1) x += C::widen(b[e]);
    if constexpr (K > 2) x += C::widen(c[e]);
    if constexpr (K > 3) x += C::widen(d[e]);
    acc[e] = x;
  }
}
// The same from inputs already widened into v[0..K).
template <int K>
MESHRT_FOLD_INLINE void add_widened(float* __restrict acc, float (*v)[kHalfTile], int64_t m) {
  const float* __restrict a = v[0];
  const float* __restrict b = v[K > 1 ? 1 : 0];
  const float* __restrict c = v[K > 2 ? 2 : 0];
  const float* __restrict d = v[K > 3 ? 3 : 0];
  for (int64_t e = 0; e < m; ++e) {
    float x = acc[e] + a[e];
    if constexpr (K > 1) x += b[e];
    if constexpr (K > 2) x += c[e];
    if constexpr (K > 3) x += d[e];
    acc[e] = x;
  }
}

// K inputs from srcs[0..K) added into acc, for one tile.
template <class C, int K>
MESHRT_FOLD_INLINE void add_group(float* acc, float (*v)[kHalfTile], const uint16_t* const* srcs,
                                  int64_t base, int64_t m) {
  if constexpr (C::kWidenInLoop) {
    add_inputs<C, K>(acc, srcs, base, m);
  } else {
    for (int k = 0; k < K; ++k) C::widen_tile(v[k], srcs[k] + base, m);
    add_widened<K>(acc, v, m);
  }
}

template <class C>
MESHRT_FOLD_INLINE void fold_half_kernel(FoldOp op, uint16_t* dst, const uint16_t* const* srcs,
                                         int64_t n, int64_t len) {
  alignas(64) float acc[kHalfTile];
  alignas(64) float v[C::kWidenInLoop ? 1 : 4][kHalfTile];
  const float nf = static_cast<float>(n);
  for (int64_t base = 0; base < len; base += kHalfTile) {
    const int64_t m = std::min(kHalfTile, len - base);
    C::widen_tile(acc, srcs[0] + base, m);
    if (op == FoldOp::max || op == FoldOp::min) {
      for (int64_t j = 1; j < n; ++j) {
        C::widen_tile(v[0], srcs[j] + base, m);
        const float* __restrict w = v[0];
        if (op == FoldOp::max) {
          for (int64_t e = 0; e < m; ++e) acc[e] = fold_max(acc[e], w[e]);
        } else {
          for (int64_t e = 0; e < m; ++e) acc[e] = fold_min(acc[e], w[e]);
        }
      }
    } else {
      for (int64_t j = 1; j < n;) {
        switch (std::min<int64_t>(n - j, 4)) {
          case 4:
            add_group<C, 4>(acc, v, srcs + j, base, m), j += 4;
            break;
          case 3:
            add_group<C, 3>(acc, v, srcs + j, base, m), j += 3;
            break;
          case 2:
            add_group<C, 2>(acc, v, srcs + j, base, m), j += 2;
            break;
          default:
            add_group<C, 1>(acc, v, srcs + j, base, m), j += 1;
            break;
        }
      }
      if (op == FoldOp::mean) {
        for (int64_t e = 0; e < m; ++e) acc[e] /= nf;
      }
    }
    C::narrow_tile(dst + base, acc, m);
  }
}

// A 16-bit pmean's last step after a 16-bit sum: divided in float, rounded once.
template <class C>
MESHRT_FOLD_INLINE void mean_half_kernel(uint16_t* dst, const uint16_t* sum, int64_t len,
                                         float divisor) {
  alignas(64) float t[kHalfTile];
  for (int64_t base = 0; base < len; base += kHalfTile) {
    const int64_t m = std::min(kHalfTile, len - base);
    C::widen_tile(t, sum + base, m);
    for (int64_t e = 0; e < m; ++e) t[e] /= divisor;
    C::narrow_tile(dst + base, t, m);
  }
}

using HalfFold = void (*)(FoldOp, bool, uint16_t*, const uint16_t* const*, int64_t, int64_t);
using HalfMean = void (*)(bool, uint16_t*, const uint16_t*, int64_t, float);

void fold_half_portable(FoldOp op, bool bf16, uint16_t* dst, const uint16_t* const* srcs, int64_t n,
                        int64_t len) {
  if (bf16) return fold_half_kernel<Bf16Bits>(op, dst, srcs, n, len);
  fold_half_kernel<F16Bits>(op, dst, srcs, n, len);
}
void mean_half_portable(bool bf16, uint16_t* dst, const uint16_t* sum, int64_t len, float div) {
  if (bf16) return mean_half_kernel<Bf16Bits>(dst, sum, len, div);
  mean_half_kernel<F16Bits>(dst, sum, len, div);
}

#ifdef MESHRT_FOLD_AVX2
// The same code for 256-bit vectors, float16 through F16C (no FMA: every addition rounds as in
// the portable path).
__attribute__((target("avx2,f16c"))) void fold_half_avx2(FoldOp op, bool bf16, uint16_t* dst,
                                                         const uint16_t* const* srcs, int64_t n,
                                                         int64_t len) {
  if (bf16) return fold_half_kernel<Bf16Bits>(op, dst, srcs, n, len);
  fold_half_kernel<F16cBits>(op, dst, srcs, n, len);
}
__attribute__((target("avx2,f16c"))) void mean_half_avx2(bool bf16, uint16_t* dst,
                                                         const uint16_t* sum, int64_t len,
                                                         float div) {
  if (bf16) return mean_half_kernel<Bf16Bits>(dst, sum, len, div);
  mean_half_kernel<F16cBits>(dst, sum, len, div);
}
#endif

bool cpu_has_avx2() {
#ifdef MESHRT_FOLD_AVX2
  // AVX2 as the compiler's runtime sees it (with the OS saving the 256-bit registers); F16C from
  // cpuid leaf 1 (clang 14's __builtin_cpu_supports does not know "f16c").
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) != 0 &&
           (c & bit_F16C) != 0;
  }();
  return has;
#else
  return false;
#endif
}

HalfFold half_fold_of(HalfFoldPath path) {
#ifdef MESHRT_FOLD_AVX2
  if (path == HalfFoldPath::avx2) return fold_half_avx2;
#endif
  (void)path;
  return fold_half_portable;
}
HalfMean half_mean_of(HalfFoldPath path) {
#ifdef MESHRT_FOLD_AVX2
  if (path == HalfFoldPath::avx2) return mean_half_avx2;
#endif
  (void)path;
  return mean_half_portable;
}

void fold_half(HalfFoldPath path, FoldOp op, DType dtype, void* dst,
               const std::vector<const void*>& srcs, int64_t len) {
  constexpr size_t kInline = 64;
  const uint16_t* inline_ptrs[kInline];
  std::vector<const uint16_t*> heap;
  const uint16_t** ptrs = inline_ptrs;
  if (srcs.size() > kInline) {
    heap.resize(srcs.size());
    ptrs = heap.data();
  }
  for (size_t j = 0; j < srcs.size(); ++j) ptrs[j] = static_cast<const uint16_t*>(srcs[j]);
  half_fold_of(path)(op, dtype == DType::bf16, static_cast<uint16_t*>(dst), ptrs,
                     static_cast<int64_t>(srcs.size()), len);
}

// ---- One fold written to many outputs (fold_to).

// Elements per tile of fold_then_copy: the tile of dsts[0] (64 KiB of float32) and a few inputs'
// tiles stay in L2 while it is copied to the other outputs.
constexpr int64_t kFoldTile = 16 * 1024;

// dsts[k][e] = fold(srcs)[e] for e in [at, at + len): tile by tile, folded into dsts[0] and
// copied from there while it is in cache.
void fold_then_copy(FoldOp op, DType in, DType out, const std::vector<void*>& dsts,
                    const std::vector<const void*>& srcs, int64_t at, int64_t len) {
  const auto ie = static_cast<int64_t>(dtype_size(in)), oe = static_cast<int64_t>(dtype_size(out));
  std::vector<const void*> part(srcs.size());
  for (int64_t base = at; base < at + len; base += kFoldTile) {
    const int64_t m = std::min(kFoldTile, at + len - base);
    for (size_t j = 0; j < srcs.size(); ++j)
      part[j] = static_cast<const char*>(srcs[j]) + base * ie;
    char* first = static_cast<char*>(dsts[0]) + base * oe;
    fold(op, in, out, first, part, m);
    for (size_t k = 1; k < dsts.size(); ++k) {
      char* d = static_cast<char*>(dsts[k]) + base * oe;
      if (d != first) std::memcpy(d, first, static_cast<size_t>(m * oe));
    }
  }
}

#ifdef MESHRT_FOLD_AVX2
// 64-byte lines [0, lines): each line of the result folded from the inputs' lines in srcs order
// (fold_into's combinations and mean division, element by element), then written to every output
// with two 32-byte non-temporal stores, which go to memory as one whole line without the line being
// read first (a store through the cache reads it: a third of a large psum's traffic). The
// outputs' lines are 64-byte aligned. Ends with a store fence, so the lines are visible to the
// members that wait for this one.
template <class T, class F>
__attribute__((target("avx2"))) void stream_lines(T* const* dsts, size_t nd, const T* const* srcs,
                                                  size_t n, int64_t lines, bool mean, F f) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  alignas(64) T t[kLine];
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t at = l * kLine;
    const T* __restrict s0 = srcs[0] + at;
    if (n == 1) {
      for (int64_t e = 0; e < kLine; ++e) t[e] = s0[e];
    } else {
      const T* __restrict s1 = srcs[1] + at;
      for (int64_t e = 0; e < kLine; ++e) t[e] = f(s0[e], s1[e]);
      for (size_t j = 2; j < n; ++j) {
        const T* __restrict s = srcs[j] + at;
        for (int64_t e = 0; e < kLine; ++e) t[e] = f(t[e], s[e]);
      }
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (mean) {
        const T tn = static_cast<T>(static_cast<double>(n));
        for (int64_t e = 0; e < kLine; ++e) t[e] = t[e] / tn;
      }
    }
    const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
    const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(t) + 1);
    for (size_t k = 0; k < nd; ++k) {
      auto* d = reinterpret_cast<__m256i*>(dsts[k] + at);
      _mm256_stream_si256(d, lo);
      _mm256_stream_si256(d + 1, hi);
    }
  }
  _mm_sfence();
}

template <class T>
void stream_typed(FoldOp op, const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                  int64_t at, int64_t lines) {
  std::vector<T*> d(dsts.size());
  std::vector<const T*> s(srcs.size());
  for (size_t k = 0; k < dsts.size(); ++k) d[k] = static_cast<T*>(dsts[k]) + at;
  for (size_t j = 0; j < srcs.size(); ++j) s[j] = static_cast<const T*>(srcs[j]) + at;
  const bool mean = op == FoldOp::mean;
  switch (op) {
    case FoldOp::max:
      return stream_lines<T>(d.data(), d.size(), s.data(), s.size(), lines, mean,
                             [](T a, T b) { return fold_max(a, b); });
    case FoldOp::min:
      return stream_lines<T>(d.data(), d.size(), s.data(), s.size(), lines, mean,
                             [](T a, T b) { return fold_min(a, b); });
    default:
      return stream_lines<T>(d.data(), d.size(), s.data(), s.size(), lines, mean,
                             [](T a, T b) { return wrap_add(a, b); });
  }
}

// The same for bfloat16 and float16, `lines` 64-byte lines (32 elements each) from element `at`:
// tiles of 256 elements folded by the AVX2 16-bit fold into a buffer in L1 (its bits:
// widened, folded in float32, rounded once), each tile's lines then streamed to every output.
// Folding line by line as stream_lines does ran at a quarter of the speed here (the widening and
// rounding of 32 elements at a time did not vectorise well).
__attribute__((target("avx2"))) void stream_half(FoldOp op, DType dtype,
                                                 const std::vector<void*>& dsts,
                                                 const std::vector<const void*>& srcs, int64_t at,
                                                 int64_t lines) {
  // 256 elements: 512 bytes of each input, eight lines, then eight lines to each output. Tiles
  // of kHalfTile (4 KiB of each input) ran 3x slower in the same minutes (a loaded VM: 139-163
  // against 45-55 ms for a 64 MiB/device psum on 8 devices); 64 elements lost to the calls.
  constexpr int64_t kTile = 256;
  const HalfFold fold = half_fold_of(HalfFoldPath::avx2);
  alignas(64) uint16_t tile[kTile];
  std::vector<const uint16_t*> ptrs(srcs.size());
  const int64_t len = lines * 32;
  for (int64_t base = 0; base < len; base += kTile) {
    const int64_t m = std::min(kTile, len - base);  // whole lines: kTile is too
    for (size_t j = 0; j < srcs.size(); ++j)
      ptrs[j] = static_cast<const uint16_t*>(srcs[j]) + at + base;
    fold(op, dtype == DType::bf16, tile, ptrs.data(), static_cast<int64_t>(srcs.size()), m);
    for (void* dv : dsts) {
      auto* d = static_cast<uint16_t*>(dv) + at + base;
      for (int64_t e = 0; e < m; e += 32) {
        const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile + e));
        const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile + e) + 1);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d + e), lo);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d + e) + 1, hi);
      }
    }
  }
  _mm_sfence();
}
#endif

}  // namespace

void fold(FoldOp op, DType in, DType out, void* dst, const std::vector<const void*>& srcs,
          int64_t len) {
  if (len <= 0) return;
  switch (in) {
    case DType::f32:
      return fold_into<float>(op, out, dst, srcs, len);
    case DType::f64:
      return fold_into<double>(op, out, dst, srcs, len);
    case DType::i32:
      return fold_into<int32_t>(op, out, dst, srcs, len);
    case DType::i64:
      return fold_into<int64_t>(op, out, dst, srcs, len);
    case DType::bf16:
    case DType::f16:
      return fold_half(half_fold_path(), op, in, dst, srcs, len);
    case DType::bool_:
      break;  // rejected by the runtime before a rendezvous
  }
  throw Error("[collectives] reduction of an unknown dtype");
}

bool fold_to_streaming(FoldOp op, DType in, DType out, const std::vector<void*>& dsts,
                       const std::vector<const void*>& srcs, int64_t len) {
#ifdef MESHRT_FOLD_AVX2
  if (!cpu_has_avx2() || in != out || len <= 0 || dsts.empty() || srcs.empty()) return false;
  const bool half = in == DType::bf16 || in == DType::f16;
  const bool floating = in == DType::f32 || in == DType::f64 || half;
  if (!floating && in != DType::i32 && in != DType::i64) return false;
  if (op == FoldOp::mean && !floating) return false;
  const auto e = static_cast<uintptr_t>(dtype_size(in));
  // Every output must reach a line boundary after the same number of elements.
  const uintptr_t phase = reinterpret_cast<uintptr_t>(dsts[0]) % 64;
  if (phase % e != 0) return false;
  for (void* d : dsts) {
    if (reinterpret_cast<uintptr_t>(d) % 64 != phase) return false;
  }
  const int64_t line = static_cast<int64_t>(64 / e);
  const int64_t head = std::min<int64_t>(len, static_cast<int64_t>((64 - phase) % 64 / e));
  const int64_t lines = (len - head) / line;
  if (head > 0) fold_then_copy(op, in, out, dsts, srcs, 0, head);
  if (lines > 0) {
    switch (in) {
      case DType::f32:
        stream_typed<float>(op, dsts, srcs, head, lines);
        break;
      case DType::f64:
        stream_typed<double>(op, dsts, srcs, head, lines);
        break;
      case DType::i32:
        stream_typed<int32_t>(op, dsts, srcs, head, lines);
        break;
      case DType::i64:
        stream_typed<int64_t>(op, dsts, srcs, head, lines);
        break;
      default:
        stream_half(op, in, dsts, srcs, head, lines);
        break;
    }
  }
  const int64_t done = head + lines * line;
  if (done < len) fold_then_copy(op, in, out, dsts, srcs, done, len - done);
  return true;
#else
  (void)op, (void)in, (void)out, (void)dsts, (void)srcs, (void)len;
  return false;
#endif
}

void fold_to(FoldOp op, DType in, DType out, const std::vector<void*>& dsts,
             const std::vector<const void*>& srcs, int64_t len, bool stream_stores) {
  if (len <= 0 || dsts.empty()) return;
  const auto written =
      static_cast<int64_t>(dsts.size()) * len * static_cast<int64_t>(dtype_size(out));
  if (stream_stores && written >= kStreamStoreBytes &&
      fold_to_streaming(op, in, out, dsts, srcs, len)) {
    return;
  }
  fold_then_copy(op, in, out, dsts, srcs, 0, len);
}

#ifdef MESHRT_FOLD_AVX2
namespace {
// `bytes` from src to dst: up to dst's first 64-byte boundary and after its last through memcpy,
// the lines between with unaligned loads and non-temporal stores (no read for ownership of dst).
__attribute__((target("avx2"))) void stream_copy(char* dst, const char* src, size_t bytes) {
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  std::memcpy(dst, src, head);
  size_t at = head;
  for (; at + 64 <= bytes; at += 64) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + at));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + at) + 1);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + at), lo);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + at) + 1, hi);
  }
  std::memcpy(dst + at, src + at, bytes - at);
}
}  // namespace
#endif

bool copy_rows_streaming(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height) {
#ifdef MESHRT_FOLD_AVX2
  if (!cpu_has_avx2()) return false;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (dpitch == width && spitch == width) {
    width *= height;
    height = 1;
  }
  for (size_t r = 0; r < height; ++r) stream_copy(d + r * dpitch, s + r * spitch, width);
  _mm_sfence();
  return true;
#else
  (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)height;
  return false;
#endif
}

void fold_rows(FoldOp op, DType dtype, void* dst, int64_t dpitch,
               const std::vector<const void*>& srcs, int64_t spitch, int64_t len, int64_t rows) {
  if (len <= 0 || rows <= 0) return;
  const auto e = static_cast<int64_t>(dtype_size(dtype));
  std::vector<const void*> row(srcs.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < srcs.size(); ++j)
      row[j] = static_cast<const char*>(srcs[j]) + r * spitch * e;
    fold(op, dtype, dtype, static_cast<char*>(dst) + r * dpitch * e, row, len);
  }
}

HalfFoldPath half_fold_path() {
  return cpu_has_avx2() ? HalfFoldPath::avx2 : HalfFoldPath::portable;
}

bool half_fold_available(HalfFoldPath path) {
  return path == HalfFoldPath::portable || cpu_has_avx2();
}

void fold_half_with(HalfFoldPath path, FoldOp op, DType dtype, void* dst,
                    const std::vector<const void*>& srcs, int64_t len) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    throw Error("[collectives] fold_half_with takes bf16 or f16");
  if (!half_fold_available(path))
    throw Error("[collectives] this CPU cannot run the requested 16-bit fold path");
  if (len > 0) fold_half(path, op, dtype, dst, srcs, len);
}

void mean_from_sum(DType in, DType out, void* dst, const void* sum, int64_t len, int64_t divisor) {
  if (in == DType::bool_) throw Error("[collectives] pmean of an unsupported dtype");
  backend::scalar::visit_any_dtype(in, [&](auto tv) {
    using T = decltype(tv);
    const T* s = static_cast<const T*>(sum);
    if constexpr (is_half_v<T>) {
      // A 16-bit sum (ring, cross-process): divided in float, rounded once.
      half_mean_of(half_fold_path())(in == DType::bf16, static_cast<uint16_t*>(dst),
                                     reinterpret_cast<const uint16_t*>(s), len,
                                     static_cast<float>(divisor));
      return;
    }
    if (out == DType::f32) {
      float* d = static_cast<float*>(dst);
      for (int64_t e = 0; e < len; ++e)
        d[e] = static_cast<float>(s[e]) / static_cast<float>(divisor);
    } else {
      double* d = static_cast<double*>(dst);
      for (int64_t e = 0; e < len; ++e)
        d[e] = static_cast<double>(s[e]) / static_cast<double>(divisor);
    }
  });
}

}  // namespace meshrt::cpu
