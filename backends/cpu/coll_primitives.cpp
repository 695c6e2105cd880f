#include "backends/cpu/coll_primitives.h"

#include <algorithm>
#include <type_traits>

#include "backends/scalar_ops.h"
#include "core/error.h"

namespace meshrt::cpu {

namespace {

using backend::FoldOp;
using backend::scalar::fold_max;
using backend::scalar::fold_min;
using backend::scalar::wrap_add;

// dst = f(...f(f(s0, s1), s2)..., s_{n-1}); the first two inputs combine straight into dst.
template <class T, class F>
void fold_with(T* __restrict dst, const std::vector<const void*>& srcs, int64_t len, F f) {
  const T* s0 = static_cast<const T*>(srcs[0]);
  if (srcs.size() == 1) {
    std::copy(s0, s0 + len, dst);
    return;
  }
  const T* s1 = static_cast<const T*>(srcs[1]);
#pragma omp simd
  for (int64_t e = 0; e < len; ++e) dst[e] = f(s0[e], s1[e]);
  for (size_t j = 2; j < srcs.size(); ++j) {
    const T* s = static_cast<const T*>(srcs[j]);
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

// bf16/f16: each tile of outputs accumulates in float over every source and rounds once (a mean
// divides in float first), so a direct fold rounds once per output whatever the group size.
template <class H>
void fold_half(FoldOp op, void* dst, const std::vector<const void*>& srcs, int64_t len) {
  constexpr int64_t kTile = 1024;
  float acc[kTile];
  float v[kTile];
  const float n = static_cast<float>(srcs.size());
  for (int64_t base = 0; base < len; base += kTile) {
    const int64_t m = std::min(kTile, len - base);
    const H* s0 = static_cast<const H*>(srcs[0]) + base;
    for (int64_t e = 0; e < m; ++e) acc[e] = static_cast<float>(s0[e]);
    for (size_t j = 1; j < srcs.size(); ++j) {
      const H* sj = static_cast<const H*>(srcs[j]) + base;
      for (int64_t e = 0; e < m; ++e) v[e] = static_cast<float>(sj[e]);
      switch (op) {
        case FoldOp::max:
          for (int64_t e = 0; e < m; ++e) acc[e] = fold_max(acc[e], v[e]);
          break;
        case FoldOp::min:
          for (int64_t e = 0; e < m; ++e) acc[e] = fold_min(acc[e], v[e]);
          break;
        default:
#pragma omp simd
          for (int64_t e = 0; e < m; ++e) acc[e] += v[e];
          break;
      }
    }
    H* d = static_cast<H*>(dst) + base;
    if (op == FoldOp::mean) {
      for (int64_t e = 0; e < m; ++e) d[e] = H(acc[e] / n);
    } else {
      for (int64_t e = 0; e < m; ++e) d[e] = H(acc[e]);
    }
  }
}

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
      return fold_half<bfloat16>(op, dst, srcs, len);
    case DType::f16:
      return fold_half<float16>(op, dst, srcs, len);
    case DType::bool_:
      break;  // rejected by the runtime before a rendezvous
  }
  throw Error("[collectives] reduction of an unknown dtype");
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

void mean_from_sum(DType in, DType out, void* dst, const void* sum, int64_t len, int64_t divisor) {
  if (in == DType::bool_) throw Error("[collectives] pmean of an unsupported dtype");
  backend::scalar::visit_any_dtype(in, [&](auto tv) {
    using T = decltype(tv);
    const T* s = static_cast<const T*>(sum);
    if constexpr (is_half_v<T>) {
      // A 16-bit sum (ring, cross-process): divided in float, rounded once.
      T* d = static_cast<T*>(dst);
      for (int64_t e = 0; e < len; ++e)
        d[e] = T(static_cast<float>(s[e]) / static_cast<float>(divisor));
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
