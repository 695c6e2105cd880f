// The cuda backend's kernels. Element semantics come from backends/scalar_ops.h, the same
// definitions the cpu kernels use.
//
// Elementwise kernels (unary, astype, binary, select) take their op as a template parameter: one
// kernel per op and dtype, no switch per element; they run on elementwise.cuh's walk (rank <= 2:
// a (rows, cols) walk, 16 bytes per access where every operand allows it; rank > 2: the general
// strided kernel).
//
// Reductions are deterministic: the order of every combination is fixed by the shape alone (see
// the comment above launch_reduce), never by timing; no atomics.
//
// bfloat16 and float16 (core/half.h, compiled for the device too) compute as on the cpu: each
// elementwise result in float32, rounded once by the very conversion functions the cpu uses;
// reductions and collective folds accumulate in float32 (Accum below) and round once per output.
// Their contiguous fast paths move 16 bytes (8 halves) per access like the other dtypes.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/elementwise.cuh"
#include "backends/cuda/elementwise_ops.cuh"
#include "backends/op_codes.h"
#include "backends/scalar_ops.h"

namespace meshrt::cuda {
namespace {

namespace sc = meshrt::backend::scalar;
using backend::BinaryOp;
using backend::code;
using backend::FoldOp;
using backend::ReduceOp;
using backend::UnaryOp;

constexpr int64_t kMaxGrid = 2147483647;

// Every dtype, the 16-bit floats included.
template <class F>
cudaError_t with_type(DType t, F&& f) {
  return sc::visit_any_dtype(t, std::forward<F>(f));
}

// What a kernel accumulates T in: float for bfloat16/float16 (rounded once, at the end), else T.
template <class T>
using Accum = std::conditional_t<is_half_v<T>, float, T>;

// An accumulator back to the stored type: the one rounding of a 16-bit result.
template <class T, class A>
__device__ __forceinline__ T narrow(A a) {
  if constexpr (is_half_v<T>)
    return T(a);
  else
    return a;
}

// ---- elementwise ops: one functor per op (elementwise_ops.cuh)

template <class I, class O, int Code>
cudaError_t unary_code(cudaStream_t s, const Dims& d, const Operand& x, void* y, int64_t n) {
  return elementwise<O, I>(s, UnaryFn<Code, I, O>{}, d, y, n, &x);
}

template <class T>
cudaError_t unary_same(cudaStream_t s, int op, const Dims& d, const Operand& x, void* y,
                       int64_t n) {
  if constexpr (sc::is_float_v<T>) {
    switch (op) {
      case sc::kNeg:
        return unary_code<T, T, sc::kNeg>(s, d, x, y, n);
      case sc::kExp:
        return unary_code<T, T, sc::kExp>(s, d, x, y, n);
      case sc::kLog:
        return unary_code<T, T, sc::kLog>(s, d, x, y, n);
      case sc::kSin:
        return unary_code<T, T, sc::kSin>(s, d, x, y, n);
      case sc::kCos:
        return unary_code<T, T, sc::kCos>(s, d, x, y, n);
      case sc::kTanh:
        return unary_code<T, T, sc::kTanh>(s, d, x, y, n);
      case sc::kSqrt:
        return unary_code<T, T, sc::kSqrt>(s, d, x, y, n);
      case sc::kRelu:
        return unary_code<T, T, sc::kRelu>(s, d, x, y, n);
      default:
        return cudaErrorInvalidValue;
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    return unary_code<T, T, 0>(s, d, x, y, n);  // scalar::unary leaves a bool as it is
  } else {
    switch (op) {
      case sc::kNeg:
        return unary_code<T, T, sc::kNeg>(s, d, x, y, n);
      case sc::kRelu:
        return unary_code<T, T, sc::kRelu>(s, d, x, y, n);
      default:  // scalar::unary leaves an integer as it is for the float-only ops
        return op >= sc::kNeg && op <= sc::kRelu ? unary_code<T, T, 0>(s, d, x, y, n)
                                                 : cudaErrorInvalidValue;
    }
  }
}

template <class I, int Op>
cudaError_t binary_op(cudaStream_t s, const Dims& d, const Operand& a, const Operand& b, void* y,
                      int64_t n) {
  const Operand ops[2] = {a, b};
  return elementwise<typename BinaryFn<Op, I>::Out, I, I>(s, BinaryFn<Op, I>{}, d, y, n, ops);
}

template <class I, int... Op>
cudaError_t binary_pick(int op, cudaStream_t s, const Dims& d, const Operand& a, const Operand& b,
                        void* y, int64_t n, std::integer_sequence<int, Op...>) {
  cudaError_t r = cudaErrorInvalidValue;
  (void)((op == Op ? (r = binary_op<I, Op>(s, d, a, b, y, n), true) : false) || ...);
  return r;
}

// ---- reductions

// A partial result: a value and, for argmax, the index it came from (-1: no element yet).
template <class T>
struct Acc {
  T v;
  int64_t i;
};

template <class T>
__device__ __forceinline__ T lowest() {
  if constexpr (std::is_floating_point_v<T>)
    return -static_cast<T>(INFINITY);
  else if constexpr (sizeof(T) == 4)
    return static_cast<T>(INT32_MIN);
  else
    return static_cast<T>(INT64_MIN);
}
template <class T>
__device__ __forceinline__ T highest() {
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(INFINITY);
  else if constexpr (sizeof(T) == 4)
    return static_cast<T>(INT32_MAX);
  else
    return static_cast<T>(INT64_MAX);
}

// backend::ReduceOp (backends/op_codes.h), by code(op). identity() leaves every value's bits as
// they are (sum: -0.0, since +0.0 would turn a lone -0.0 into +0.0); combine(a, b) takes a first.
template <int Op, class T>
struct Red {
  __device__ __forceinline__ static Acc<T> identity() {
    if constexpr (Op == code(ReduceOp::sum))
      return {std::is_floating_point_v<T> ? static_cast<T>(-0.0) : T(0), 0};
    else if constexpr (Op == code(ReduceOp::max))
      return {lowest<T>(), 0};
    else if constexpr (Op == code(ReduceOp::min))
      return {highest<T>(), 0};
    else
      return {T(0), -1};
  }
  __device__ __forceinline__ static Acc<T> combine(const Acc<T>& a, const Acc<T>& b) {
    if constexpr (Op == code(ReduceOp::sum)) {
      return {sc::wrap_add(a.v, b.v), 0};
    } else if constexpr (Op == code(ReduceOp::max)) {
      return {sc::max_nan(a.v, b.v), 0};
    } else if constexpr (Op == code(ReduceOp::min)) {
      return {sc::min_nan(a.v, b.v), 0};
    } else {
      // The first NaN if there is one, else the first maximum (scalar::argmax_better's scan).
      if (a.i < 0) return b;
      if (b.i < 0) return a;
      if constexpr (std::is_floating_point_v<T>) {
        const bool an = a.v != a.v, bn = b.v != b.v;
        if (an || bn) return an && bn ? (a.i < b.i ? a : b) : (an ? a : b);
      }
      if (a.v > b.v) return a;
      if (b.v > a.v) return b;
      return a.i < b.i ? a : b;
    }
  }
};

// x dense [outer, len, inner] of S: element (o, l, i), widened to the accumulator type T, with its
// index l.
template <class S, class T>
struct DirectSrc {
  const S* x;
  int64_t len, inner;
  __device__ __forceinline__ Acc<T> operator()(int64_t o, int64_t l, int64_t i) const {
    return {static_cast<T>(x[(o * len + l) * inner + i]), l};
  }
};
// A first pass's partials [outer, chunks, inner] (len = chunks), with their indices for argmax.
template <class T>
struct PartialSrc {
  const T* v;
  const int64_t* idx;  // null unless argmax
  int64_t len, inner;
  __device__ __forceinline__ Acc<T> operator()(int64_t o, int64_t l, int64_t i) const {
    const int64_t k = (o * len + l) * inner + i;
    return {v[k], idx != nullptr ? idx[k] : 0};
  }
};
// y [outer, inner] of S: the value (rounded once from the accumulator type T), or the index for
// argmax.
template <int Op, class S, class T>
struct FinalDst {
  void* y;
  int64_t inner;
  __device__ __forceinline__ void operator()(int64_t o, int64_t, int64_t i, const Acc<T>& a) const {
    if constexpr (Op == code(ReduceOp::argmax))
      static_cast<int64_t*>(y)[o * inner + i] = a.i;
    else
      static_cast<S*>(y)[o * inner + i] = narrow<S>(a.v);
  }
};
template <class T>
struct PartialDst {
  T* v;
  int64_t* idx;  // null unless argmax
  int64_t chunks, inner;
  __device__ __forceinline__ void operator()(int64_t o, int64_t c, int64_t i,
                                             const Acc<T>& a) const {
    const int64_t k = (o * chunks + c) * inner + i;
    v[k] = a.v;
    if (idx != nullptr) idx[k] = a.i;
  }
};

// One thread's elements l = l0, l0 + step, ... < l1 of column i: the k-th into accumulator k % 4
// (the last count % 4 into accumulator 0), then (a0 + a1) + (a2 + a3). Four independent chains
// keep four loads in flight.
template <int Op, class T, class Src>
__device__ __forceinline__ Acc<T> thread_fold(const Src& src, int64_t o, int64_t l0, int64_t l1,
                                              int64_t step, int64_t i) {
  using R = Red<Op, T>;
  Acc<T> a0 = R::identity(), a1 = a0, a2 = a0, a3 = a0;
  int64_t l = l0;
  for (; l + 3 * step < l1; l += 4 * step) {
    const Acc<T> x0 = src(o, l, i), x1 = src(o, l + step, i), x2 = src(o, l + 2 * step, i),
                 x3 = src(o, l + 3 * step, i);
    a0 = R::combine(a0, x0);
    a1 = R::combine(a1, x1);
    a2 = R::combine(a2, x2);
    a3 = R::combine(a3, x3);
  }
  for (; l < l1; l += step) a0 = R::combine(a0, src(o, l, i));
  return R::combine(R::combine(a0, a1), R::combine(a2, a3));
}

// Lane 0 gets the warp's fold: at offsets 16, 8, 4, 2, 1, lane j takes (lane j, lane j + off).
template <int Op, class T>
__device__ __forceinline__ Acc<T> warp_fold(Acc<T> a) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const Acc<T> b{__shfl_down_sync(0xffffffffu, a.v, off),
                   __shfl_down_sync(0xffffffffu, a.i, off)};
    a = Red<Op, T>::combine(a, b);
  }
  return a;
}

// Rows (inner == 1): G threads (a warp, or the block of kThreads) per segment, a segment being
// chunk c of row o (chunk_len elements; chunks == 1 folds whole rows). Thread t of a segment
// folds elements t, t + G, ... (thread_fold), the warp folds its lanes (warp_fold), and for
// G = kThreads warp 0 folds the 8 warps' results the same way (warp w as lane w).
template <int Op, int G, class T, class Src, class Dst>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_kernel(Src src, Dst dst, int64_t outer, int64_t len, int64_t chunks,
                       int64_t chunk_len) {
  using R = Red<Op, T>;
  constexpr int kPerBlock = kThreads / G;
  const int t = static_cast<int>(threadIdx.x) % G;
  const int64_t seg = blockIdx.x * int64_t{kPerBlock} + threadIdx.x / G;
  const bool live = seg < outer * chunks;
  const int64_t o = live ? seg / chunks : 0, c = live ? seg % chunks : 0;
  Acc<T> a = R::identity();
  if (live) {
    const int64_t l0 = c * chunk_len, l1 = l0 + chunk_len < len ? l0 + chunk_len : len;
    a = thread_fold<Op, T>(src, o, l0 + t, l1, G, 0);
  }
  a = warp_fold<Op, T>(a);
  if constexpr (G > 32) {
    __shared__ T sv[kThreads / 32];
    __shared__ int64_t si[kThreads / 32];
    const int lane = static_cast<int>(threadIdx.x) % 32, w = static_cast<int>(threadIdx.x) / 32;
    if (lane == 0) {
      sv[w] = a.v;
      si[w] = a.i;
    }
    __syncthreads();
    if (w == 0) {
      a = lane < kThreads / 32 ? Acc<T>{sv[lane], si[lane]} : R::identity();
      a = warp_fold<Op, T>(a);
    }
  }
  if (live && t == 0) dst(o, c, 0, a);
}

// Columns (inner > 1): blocks of 32 x 8 threads; block (x, y) covers columns 32 * tile .. + 31 of
// outer index o (x = o * tiles + tile) over chunk y of len. Thread (tx, ty) folds elements
// l = l0 + ty, l0 + ty + 8, ... of its column (thread_fold; a warp reads 32 adjacent columns of
// one row), then the 8 thread rows fold in shared memory: (ty, ty + 4), then (ty, ty + 2), then
// (0, 1).
template <int Op, class T, class Src, class Dst>
__global__ void __launch_bounds__(kThreads)
    reduce_cols_kernel(Src src, Dst dst, int64_t len, int64_t inner, int64_t tiles,
                       int64_t chunk_len) {
  using R = Red<Op, T>;
  constexpr int kRows = kThreads / 32;
  __shared__ T sv[kRows][32];
  __shared__ int64_t si[kRows][32];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t o = blockIdx.x / tiles, i = (blockIdx.x % tiles) * 32 + tx;
  const int64_t c = blockIdx.y;
  const int64_t l0 = c * chunk_len, l1 = l0 + chunk_len < len ? l0 + chunk_len : len;
  Acc<T> a = R::identity();
  if (i < inner) a = thread_fold<Op, T>(src, o, l0 + ty, l1, kRows, i);
  sv[ty][tx] = a.v;
  si[ty][tx] = a.i;
  __syncthreads();
#pragma unroll
  for (int h = kRows / 2; h > 0; h >>= 1) {
    if (ty < h) {
      const Acc<T> r =
          R::combine(Acc<T>{sv[ty][tx], si[ty][tx]}, Acc<T>{sv[ty + h][tx], si[ty + h][tx]});
      sv[ty][tx] = r.v;
      si[ty][tx] = r.i;
    }
    __syncthreads();
  }
  if (ty == 0 && i < inner) dst(o, c, i, Acc<T>{sv[0][tx], si[0][tx]});
}

// Split sizes. A first pass aims at about kTargetBlocks blocks (one wave on an H100/H200) and
// splits len only into chunks of at least kMinRowChunk (rows) or kMinColChunk (columns)
// elements. Constants, not the GPU's size: the order, and so the bits, depend on the shape only.
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kWarpRowMax = 1024;  // rows up to this length: a warp per row, no split
constexpr int64_t kMinRowChunk = 4096;
constexpr int64_t kMinColChunk = 64;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How many chunks len splits into for `blocks` first-pass blocks; chunk_len set to match.
int64_t split(int64_t len, int64_t blocks, int64_t min_chunk, int64_t& chunk_len) {
  int64_t chunks = ceil_div(kTargetBlocks, blocks < 1 ? 1 : blocks);
  const int64_t most = len / min_chunk;
  if (chunks > most) chunks = most;
  if (chunks < 1) chunks = 1;
  chunk_len = ceil_div(len, chunks);
  return ceil_div(len, chunk_len);
}

template <int Op, class T, class Src, class Dst>
cudaError_t rows_pass(cudaStream_t s, const Src& src, const Dst& dst, int64_t outer, int64_t len,
                      int64_t chunks, int64_t chunk_len) {
  const int64_t segs = outer * chunks;
  if (len <= kWarpRowMax && chunks == 1) {
    const int64_t blocks = ceil_div(segs, kThreads / 32);
    if (blocks > kMaxGrid) return cudaErrorInvalidConfiguration;
    reduce_rows_kernel<Op, 32, T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        src, dst, outer, len, chunks, chunk_len);
  } else {
    if (segs > kMaxGrid) return cudaErrorInvalidConfiguration;
    reduce_rows_kernel<Op, kThreads, T>
        <<<static_cast<unsigned>(segs), kThreads, 0, s>>>(src, dst, outer, len, chunks, chunk_len);
  }
  return cudaGetLastError();
}

template <int Op, class T, class Src, class Dst>
cudaError_t cols_pass(cudaStream_t s, const Src& src, const Dst& dst, int64_t outer, int64_t len,
                      int64_t inner, int64_t chunks, int64_t chunk_len) {
  const int64_t tiles = ceil_div(inner, 32);
  if (outer * tiles > kMaxGrid || chunks > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(outer * tiles), static_cast<unsigned>(chunks));
  reduce_cols_kernel<Op, T>
      <<<grid, dim3(32, kThreads / 32), 0, s>>>(src, dst, len, inner, tiles, chunk_len);
  return cudaGetLastError();
}

// The stream-ordered pool keeps up to 64 MiB after a free (its default, 0, would hand the
// reductions' scratch back to the driver at every synchronisation and fetch it again).
void keep_pool_memory() {
  static std::atomic<bool> done[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return;
  }
  if (done[dev].exchange(true)) return;
  cudaMemPool_t pool = nullptr;
  uint64_t keep = uint64_t{64} << 20;
  if (cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess ||
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

// Elements of S, accumulated in T = Accum<S> (float for the 16-bit floats: partials stay float
// between passes, so the result rounds once).
template <int Op, class S>
cudaError_t reduce_typed(cudaStream_t s, int64_t outer, int64_t len, int64_t inner, const S* x,
                         void* y) {
  using T = Accum<S>;
  const DirectSrc<S, T> direct{x, len, inner};
  const FinalDst<Op, S, T> final_dst{y, inner};
  int64_t chunk_len = len, chunks = 1;
  if (inner == 1) {
    if (len > kWarpRowMax) chunks = split(len, outer, kMinRowChunk, chunk_len);
  } else {
    chunks = split(len, outer * ceil_div(inner, 32), kMinColChunk, chunk_len);
  }
  auto pass = [&](const auto& src, const auto& dst, int64_t l, int64_t ch, int64_t cl) {
    return inner == 1 ? rows_pass<Op, T>(s, src, dst, outer, l, ch, cl)
                      : cols_pass<Op, T>(s, src, dst, outer, l, inner, ch, cl);
  };
  if (chunks == 1) return pass(direct, final_dst, len, 1, len);
  // Two passes: the chunks' partials [outer, chunks, inner] in stream-ordered scratch, then one
  // fold over them (chunks in order, the same kernels without a split).
  const size_t count = static_cast<size_t>(outer * chunks * inner);
  const size_t idx_bytes = Op == code(ReduceOp::argmax) ? count * sizeof(int64_t) : 0;
  keep_pool_memory();
  void* scratch = nullptr;
  cudaError_t e = cudaMallocAsync(&scratch, idx_bytes + count * sizeof(T), s);
  if (e != cudaSuccess) return e;
  auto* idx = Op == code(ReduceOp::argmax) ? static_cast<int64_t*>(scratch) : nullptr;
  T* vals = reinterpret_cast<T*>(static_cast<char*>(scratch) + idx_bytes);
  e = pass(direct, PartialDst<T>{vals, idx, chunks, inner}, len, chunks, chunk_len);
  if (e == cudaSuccess)
    e = pass(PartialSrc<T>{vals, idx, chunks, inner}, final_dst, chunks, 1, chunks);
  const cudaError_t f = cudaFreeAsync(scratch, s);
  return e != cudaSuccess ? e : f;
}

template <class T>
__global__ void fill_kernel(T* y, int64_t n, double value, bool iota) {
  const T v = sc::convert<T>(value);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = iota ? static_cast<T>(i) : v;
  }
}

template <class T>
__global__ void int_matmul_kernel(int64_t batch, int64_t m, int64_t n, int64_t k, const T* a,
                                  const T* b, T* c) {
  const int64_t total = batch * m * n;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = idx / (m * n), r = (idx / n) % m, j = idx % n;
    const T* A = a + bt * m * k + r * k;
    const T* B = b + bt * k * n + j;
    T acc = T(0);
    for (int64_t q = 0; q < k; ++q) acc = sc::wrap_add(acc, sc::wrap_mul(A[q], B[q * n]));
    c[idx] = acc;
  }
}

struct Sources {
  const void* p[kMaxFoldSources];
};

// Element (r, e) of `rows` rows of `len`: dst at r*dpitch + e, every source at r*spitch + e,
// folded in A = Accum<T>. acc_in (pitch in_pitch), when set, is the first operand (the fold so
// far, over earlier sources); acc_out (pitch len), when set, receives the accumulator instead of
// dst. divisor > 0 (mean of 16-bit floats) divides the sum in A before the one rounding.
template <class T>
__global__ void fold_kernel(int op, T* dst, int64_t dpitch, Sources s, int count, int64_t spitch,
                            int64_t len, int64_t rows, const Accum<T>* acc_in, int64_t in_pitch,
                            Accum<T>* acc_out, int64_t divisor) {
  using A = Accum<T>;
  const int64_t total = len * rows;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / len, e = i % len;
    const int64_t at = r * spitch + e;
    A acc = acc_in != nullptr ? acc_in[r * in_pitch + e]
                              : static_cast<A>(static_cast<const T*>(s.p[0])[at]);
    for (int j = acc_in != nullptr ? 0 : 1; j < count; ++j) {
      const A v = static_cast<A>(static_cast<const T*>(s.p[j])[at]);
      acc = op == code(FoldOp::max)   ? sc::fold_max(acc, v)
            : op == code(FoldOp::min) ? sc::fold_min(acc, v)
                                      : sc::wrap_add(acc, v);
    }
    if (acc_out != nullptr) {
      acc_out[r * len + e] = acc;
    } else if constexpr (is_half_v<T>) {
      dst[r * dpitch + e] = T(divisor > 0 ? acc / static_cast<float>(divisor) : acc);
    } else {
      dst[r * dpitch + e] = acc;
    }
  }
}

// One fold written to several outputs (direct psum/pmax/pmin between logical devices): thread
// t reads element (or 16-byte vector) i of every source once, folds them left to right (the
// order fold_kernel uses, so the bits are the same) and writes the result to every output.
struct FoldTo {
  const void* src[kMaxFoldTo];
  void* dst[kMaxFoldTo];
};

// Op sum and mean add (a mean divides once, at the end).
template <int Op, class T>
__device__ __forceinline__ T fold_pair(T a, T b) {
  if constexpr (Op == code(FoldOp::max))
    return sc::fold_max(a, b);
  else if constexpr (Op == code(FoldOp::min))
    return sc::fold_min(a, b);
  else
    return sc::wrap_add(a, b);
}

// A fold's accumulator as the stored result: mean divides by the source count first (16-bit
// floats only; the other dtypes' pmean divides in launch_mean).
template <int Op, class T, class A>
__device__ __forceinline__ T fold_result(A acc, int nsrc) {
  if constexpr (Op == code(FoldOp::mean))
    return narrow<T>(acc / static_cast<A>(nsrc));
  else
    return narrow<T>(acc);
}

template <class T>
struct alignas(16) Vec16 {
  static constexpr int kLanes = 16 / static_cast<int>(sizeof(T));
  T v[kLanes];
};

// Vectors [0, nvec) of 16 bytes, then the scalar tail [nvec * lanes, len). Lanes accumulate in
// Accum<T> (float for the 16-bit floats, 8 lanes a vector) and round once.
template <int Op, class T>
__global__ void fold_to_kernel(FoldTo p, int nsrc, int ndst, int64_t nvec, int64_t len) {
  using V = Vec16<T>;
  using A = Accum<T>;
  constexpr int L = V::kLanes;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int64_t i = first; i < nvec; i += stride) {
    const V v0 = static_cast<const V*>(p.src[0])[i];
    A acc[L];
#pragma unroll
    for (int l = 0; l < L; ++l) acc[l] = static_cast<A>(v0.v[l]);
    for (int j = 1; j < nsrc; ++j) {
      const V v = static_cast<const V*>(p.src[j])[i];
#pragma unroll
      for (int l = 0; l < L; ++l) acc[l] = fold_pair<Op, A>(acc[l], static_cast<A>(v.v[l]));
    }
    V out;
#pragma unroll
    for (int l = 0; l < L; ++l) out.v[l] = fold_result<Op, T>(acc[l], nsrc);
    for (int k = 0; k < ndst; ++k) static_cast<V*>(p.dst[k])[i] = out;
  }
  for (int64_t e = nvec * L + first; e < len; e += stride) {
    A acc = static_cast<A>(static_cast<const T*>(p.src[0])[e]);
    for (int j = 1; j < nsrc; ++j)
      acc = fold_pair<Op, A>(acc, static_cast<A>(static_cast<const T*>(p.src[j])[e]));
    const T out = fold_result<Op, T>(acc, nsrc);
    for (int k = 0; k < ndst; ++k) static_cast<T*>(p.dst[k])[e] = out;
  }
}

// O is float or double; a 16-bit sum (I = O) divides in float and rounds once, as the cpu's.
template <class I, class O>
__global__ void mean_kernel(O* dst, const I* sum, int64_t len, int64_t divisor) {
  using C = Accum<O>;
  const C d = static_cast<C>(divisor);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < len;
       e += int64_t{gridDim.x} * blockDim.x) {
    dst[e] = narrow<O>(static_cast<C>(sum[e]) / d);
  }
}

}  // namespace

cudaError_t launch_unary(cudaStream_t s, int op, DType in, DType out, const Dims& d,
                         const Operand& x, void* y, int64_t n) {
  if (n == 0) return cudaSuccess;
  return with_type(in, [&](auto iv) {
    using I = decltype(iv);
    return with_type(out, [&](auto ov) -> cudaError_t {
      using O = decltype(ov);
      if (op == code(UnaryOp::copy)) return unary_code<I, O, code(UnaryOp::copy)>(s, d, x, y, n);
      if constexpr (std::is_same_v<I, O>) {
        return unary_same<I>(s, op, d, x, y, n);
      } else {
        return cudaErrorInvalidValue;  // only astype converts
      }
    });
  });
}

cudaError_t launch_binary(cudaStream_t s, int op, DType in, DType out, const Dims& d,
                          const Operand& a, const Operand& b, void* y, int64_t n) {
  if (n == 0) return cudaSuccess;
  if (op >= code(BinaryOp::eq) ? out != DType::bool_ : out != in) return cudaErrorInvalidValue;
  return with_type(in, [&](auto iv) -> cudaError_t {
    using I = decltype(iv);
    if constexpr (std::is_same_v<I, float16>) {
      if (op == code(BinaryOp::div)) {
        // A broadcast divisor (a dimension of size > 1 that b does not advance along; merging
        // keeps such a dimension's stride 0) divides through its reciprocal, as the cpu kernel.
        if (divisor_broadcast(d.rank, d.size, b.stride)) {
          const Operand ops[2] = {a, b};
          return elementwise<I, I, I>(s, RecipDivFn<I>{}, d, y, n, ops);
        }
      }
    }
    if constexpr (sc::is_float_v<I>) {
      return binary_pick<I>(op, s, d, a, b, y, n,
                            std::make_integer_sequence<int, code(BinaryOp::ge) + 1>{});
    } else {
      if (op == code(BinaryOp::div)) return cudaErrorInvalidValue;  // ints divide as floats
      return binary_pick<I>(
          op, s, d, a, b, y, n,
          std::integer_sequence<int, code(BinaryOp::add), code(BinaryOp::sub), code(BinaryOp::mul),
                                code(BinaryOp::max), code(BinaryOp::min), code(BinaryOp::eq),
                                code(BinaryOp::ne), code(BinaryOp::lt), code(BinaryOp::le),
                                code(BinaryOp::gt), code(BinaryOp::ge)>{});
    }
  });
}

cudaError_t launch_select(cudaStream_t s, DType t, const Dims& d, const Operand& cond,
                          const Operand& a, const Operand& b, void* y, int64_t n) {
  if (n == 0) return cudaSuccess;
  return with_type(t, [&](auto tv) {
    using T = decltype(tv);
    const Operand ops[3] = {cond, a, b};
    return elementwise<T, uint8_t, T, T>(s, SelectFn<T>{}, d, y, n, ops);
  });
}

// Reduction order (fixed by (outer, len, inner) alone, so every run gives the same bits):
//   * inner == 1, len <= 1024: a warp per row; lane t folds elements t, t + 32, ... into four
//     accumulators (the k-th element into k % 4, leftovers into 0, then (a0 + a1) + (a2 + a3)),
//     then the lanes fold as a shuffle tree (lane j with lane j + 16, 8, 4, 2, 1).
//   * inner == 1, longer rows: each row is split into `chunks` chunks (split() above); a block
//     of 256 folds a chunk: thread t over t, t + 256, ... as above, a shuffle tree per warp, then
//     the 8 warps' results by the same tree.
//   * inner > 1: blocks of 32 columns x 8 thread rows over a chunk of len; thread row r folds
//     l = r, r + 8, ... as above; the 8 thread rows fold pairwise ((r, r + 4), (r, r + 2), (0, 1)).
//   * with chunks > 1 the chunks' partials go to scratch and one more pass of the same kernels
//     folds them (chunk c as element c).
// Integer sums wrap and equal the cpu's; float sums differ from cpu's left-to-right order by
// rounding only. max/min propagate NaN; argmax gives the first NaN, else the first maximum.
cudaError_t launch_reduce(cudaStream_t s, int op, DType t, int64_t outer, int64_t len,
                          int64_t inner, const void* x, void* y) {
  const int64_t rows = outer * inner;
  if (rows == 0) return cudaSuccess;
  if (op < code(ReduceOp::sum) || op > code(ReduceOp::argmax)) return cudaErrorInvalidValue;
  return with_type(t, [&](auto tv) -> cudaError_t {
    using T = decltype(tv);
    if constexpr (std::is_same_v<T, bool>) {
      return cudaErrorInvalidValue;  // the runtime converts bool to an integer first
    } else {
      if (len == 0) {  // the cpu kernel's answer: zeros
        if (op == code(ReduceOp::argmax))
          fill_kernel<int64_t>
              <<<blocks_for(rows), kThreads, 0, s>>>(static_cast<int64_t*>(y), rows, 0.0, false);
        else
          fill_kernel<T>
              <<<blocks_for(rows), kThreads, 0, s>>>(static_cast<T*>(y), rows, 0.0, false);
        return cudaGetLastError();
      }
      const T* xp = static_cast<const T*>(x);
      switch (op) {
        case code(ReduceOp::sum):
          return reduce_typed<code(ReduceOp::sum), T>(s, outer, len, inner, xp, y);
        case code(ReduceOp::max):
          return reduce_typed<code(ReduceOp::max), T>(s, outer, len, inner, xp, y);
        case code(ReduceOp::min):
          return reduce_typed<code(ReduceOp::min), T>(s, outer, len, inner, xp, y);
        default:
          return reduce_typed<code(ReduceOp::argmax), T>(s, outer, len, inner, xp, y);
      }
    }
  });
}

cudaError_t launch_fill(cudaStream_t s, DType t, int64_t n, double value, bool iota, void* y) {
  if (n == 0) return cudaSuccess;
  return with_type(t, [&](auto tv) {
    using T = decltype(tv);
    fill_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(y), n, value, iota);
    return cudaGetLastError();
  });
}

cudaError_t launch_int_matmul(cudaStream_t s, DType t, int64_t batch, int64_t m, int64_t n,
                              int64_t k, const void* a, const void* b, void* c) {
  const int64_t total = batch * m * n;
  if (total == 0) return cudaSuccess;
  return with_type(t, [&](auto tv) {
    using T = decltype(tv);
    if constexpr (std::is_same_v<T, bool> || is_half_v<T>) {
      return cudaErrorInvalidValue;  // bool is converted by the runtime; halves go to cuBLAS
    } else {
      int_matmul_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(
          batch, m, n, k, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c));
      return cudaGetLastError();
    }
  });
}

cudaError_t launch_fold_rows(cudaStream_t s, int op, DType t, void* dst, int64_t dpitch,
                             const void* const* srcs, int64_t count, int64_t spitch, int64_t len,
                             int64_t rows) {
  if (len == 0 || rows == 0) return cudaSuccess;
  if (count < 1 || op < code(FoldOp::sum) || op > code(FoldOp::mean)) return cudaErrorInvalidValue;
  if (op == code(FoldOp::mean) && !is_half(t)) return cudaErrorInvalidValue;
  return with_type(t, [&](auto tv) -> cudaError_t {
    using T = decltype(tv);
    using A = Accum<T>;
    T* d = static_cast<T*>(dst);
    const int64_t divisor = op == code(FoldOp::mean) ? count : 0;
    const int blocks = blocks_for(len * rows);
    // Up to kMaxFoldSources sources a launch. Beyond, the fold so far carries over: in dst itself
    // where the accumulator is the stored type, else (16-bit floats) in float scratch, so the
    // result still rounds once.
    A* scratch = nullptr;
    if (is_half_v<T> && count > kMaxFoldSources) {
      keep_pool_memory();
      const cudaError_t e =
          cudaMallocAsync(reinterpret_cast<void**>(&scratch), len * rows * sizeof(A), s);
      if (e != cudaSuccess) return e;
    }
    cudaError_t e = cudaSuccess;
    for (int64_t at = 0; at < count && e == cudaSuccess; at += kMaxFoldSources) {
      const int take = static_cast<int>(std::min<int64_t>(count - at, kMaxFoldSources));
      Sources src{};
      for (int j = 0; j < take; ++j) src.p[j] = srcs[at + j];
      const bool first = at == 0, last = at + take == count;
      const A* acc_in = nullptr;
      int64_t in_pitch = 0;
      A* acc_out = nullptr;
      if constexpr (is_half_v<T>) {
        if (!first) {
          acc_in = scratch;
          in_pitch = len;
        }
        if (!last) acc_out = scratch;
      } else if (!first) {
        acc_in = d;
        in_pitch = dpitch;
      }
      fold_kernel<T><<<blocks, kThreads, 0, s>>>(op, d, dpitch, src, take, spitch, len, rows,
                                                 acc_in, in_pitch, acc_out, divisor);
      e = cudaGetLastError();
    }
    if (scratch != nullptr) {
      const cudaError_t f = cudaFreeAsync(scratch, s);
      if (e == cudaSuccess) e = f;
    }
    return e;
  });
}

cudaError_t launch_fold_to(cudaStream_t s, int op, DType t, void* const* dsts, int ndst,
                           const void* const* srcs, int nsrc, int64_t len) {
  if (len == 0 || ndst == 0) return cudaSuccess;
  if (nsrc < 1 || nsrc > kMaxFoldTo || ndst < 0 || ndst > kMaxFoldTo) return cudaErrorInvalidValue;
  if (op < code(FoldOp::sum) || op > code(FoldOp::mean)) return cudaErrorInvalidValue;
  if (op == code(FoldOp::mean) && !is_half(t)) return cudaErrorInvalidValue;
  FoldTo p{};
  bool aligned = true;
  for (int j = 0; j < nsrc; ++j) {
    p.src[j] = srcs[j];
    aligned = aligned && reinterpret_cast<uintptr_t>(srcs[j]) % 16 == 0;
  }
  for (int k = 0; k < ndst; ++k) {
    p.dst[k] = dsts[k];
    aligned = aligned && reinterpret_cast<uintptr_t>(dsts[k]) % 16 == 0;
  }
  return with_type(t, [&](auto tv) {
    using T = decltype(tv);
    const int64_t lanes = Vec16<T>::kLanes;
    const int64_t nvec = aligned ? len / lanes : 0;
    const int64_t work = nvec + (len - nvec * lanes);
    // Enough blocks to keep every source's reads in flight; the loop strides over the rest.
    const int blocks = static_cast<int>(std::min<int64_t>(blocks_for(work), sm_count() * 8));
    switch (op) {
      case code(FoldOp::sum):
        fold_to_kernel<code(FoldOp::sum), T><<<blocks, kThreads, 0, s>>>(p, nsrc, ndst, nvec, len);
        break;
      case code(FoldOp::max):
        fold_to_kernel<code(FoldOp::max), T><<<blocks, kThreads, 0, s>>>(p, nsrc, ndst, nvec, len);
        break;
      case code(FoldOp::mean):
        if constexpr (is_half_v<T>) {
          fold_to_kernel<code(FoldOp::mean), T>
              <<<blocks, kThreads, 0, s>>>(p, nsrc, ndst, nvec, len);
        }
        break;
      default:
        fold_to_kernel<code(FoldOp::min), T><<<blocks, kThreads, 0, s>>>(p, nsrc, ndst, nvec, len);
        break;
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_mean(cudaStream_t s, DType in, DType out, void* dst, const void* sum,
                        int64_t len, int64_t divisor) {
  if (len == 0) return cudaSuccess;
  return with_type(in, [&](auto iv) {
    using I = decltype(iv);
    if constexpr (is_half_v<I>) {
      if (out != in) return cudaErrorInvalidValue;  // a 16-bit pmean stays in its dtype
      mean_kernel<I, I><<<blocks_for(len), kThreads, 0, s>>>(
          static_cast<I*>(dst), static_cast<const I*>(sum), len, divisor);
    } else if (out == DType::f32) {
      mean_kernel<I, float><<<blocks_for(len), kThreads, 0, s>>>(
          static_cast<float*>(dst), static_cast<const I*>(sum), len, divisor);
    } else {
      mean_kernel<I, double><<<blocks_for(len), kThreads, 0, s>>>(
          static_cast<double*>(dst), static_cast<const I*>(sum), len, divisor);
    }
    return cudaGetLastError();
  });
}

}  // namespace meshrt::cuda
