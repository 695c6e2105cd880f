// backends/cuda/elementwise.cuh: the elementwise walk shared by cuda_kernels.cu's single-op
// kernels and fused_kernels.cu's fused pairs (device code; included by .cu files only).
//
// After merge_dims an iteration space of rank <= 2 is a walk over (rows, cols) in which every
// operand's offset is row * rs + col * cs: dense operands (one row), a broadcast scalar (0, 0), a
// broadcast row such as a bias (0, 1), a broadcast column (1, 0), a 2-d transpose. A thread keeps
// its (row, col) and steps it by the grid's stride with one compare, so no element pays for an
// index division. Where every operand is read along the row (cs 0 or 1) and 16-byte aligned, a
// thread moves 16 bytes per operand at once (V elements; the tail of a single row that V does not
// divide goes one element per thread). Rank > 2 takes the general kernel: a mixed-radix offset per
// element. `elementwise<O, T...>(stream, f, dims, y, n, operands)` picks the path.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "backends/cuda/cuda_kernels.h"

namespace meshrt::cuda {

inline constexpr int kThreads = 256;

inline int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 8 ? (b < 1 ? 1 : b) : 65535 * 8);
}

// A value of the current GPU, computed once by query(dev, v) (true when it answered) and cached
// per GPU in `cache`; `fallback` when the GPU is unknown or the query fails.
template <class Query>
int per_gpu(std::atomic<int> (&cache)[64], int fallback, Query query) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return fallback;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    if (!query(dev, v) || v <= 0) {
      (void)cudaGetLastError();
      v = fallback;
    }
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

// The current GPU's multiprocessors (132, an H100's count, when unknown).
inline int sm_count() {
  static std::atomic<int> cache[64];
  return per_gpu(cache, 132, [](int dev, int& v) {
    return cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
  });
}

// Blocks for a grid-stride elementwise launch over `items`: a full GPU's worth (8 resident
// blocks per multiprocessor) at most, so a thread walks several items and its setup is shared.
inline int grid_for(int64_t items) {
  const int64_t need = (items + kThreads - 1) / kThreads;
  const int64_t cap = int64_t{sm_count()} * 8;
  return static_cast<int>(need < 1 ? 1 : (need < cap ? need : cap));
}

// V consecutive elements, loaded or stored as one access.
template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// An operand of the (rows, cols) walk: element (row, col) is at p[row * rs + col * cs].
template <class T>
struct Walk {
  const T* p;
  int64_t rs, cs;
};

// Elements col..col+V-1 of `row`; with V > 1, cs is 0 (one value, repeated) or 1 (one aligned
// vector access; the host checked the alignment).
template <int V, class T>
__device__ __forceinline__ Vec<T, V> load(const Walk<T>& o, int64_t row, int64_t col) {
  Vec<T, V> r;
  const T* q = o.p + row * o.rs;
  if constexpr (V == 1) {
    r.v[0] = q[col * o.cs];
  } else if (o.cs == 0) {
    const T s = q[0];
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = s;
  } else {
    r = *reinterpret_cast<const Vec<T, V>*>(q + col);
  }
  return r;
}

// y (dense, rows x cols) = f(operands...), V elements per access. When rows > 1 the host makes V
// divide cols; a single row's tail (cols % V elements) is done one element per thread.
// step_r/step_c: the grid's stride (gridDim.x * blockDim.x vectors) in rows and vectors.
template <int V, class F, class O, class... T>
__global__ void __launch_bounds__(kThreads)
    walk_kernel(F f, O* y, int64_t rows, int64_t cols, int64_t step_r, int64_t step_c,
                Walk<T>... in) {
  const int64_t cv = cols / V;
  const int64_t total = rows * cv;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  int64_t row = 0, col = first;
  if (rows > 1 && first < total) {
    row = first / cv;
    col = first - row * cv;
  }
  for (int64_t j = first; j < total; j += step) {
    const int64_t c = col * V;
    Vec<O, V> out;
    auto apply = [&](const auto&... v) {
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = f(v.v[k]...);
    };
    apply(load<V>(in, row, c)...);
    *reinterpret_cast<Vec<O, V>*>(y + row * cols + c) = out;
    col += step_c;
    row += step_r;
    if (col >= cv) {
      col -= cv;
      ++row;
    }
  }
  if constexpr (V > 1) {
    const int64_t e = cv * V + first;
    if (rows == 1 && e < cols) y[e] = f(load<1>(in, 0, e).v[0]...);
  }
}

template <int N>
struct Operands {
  Operand o[N];
};

template <class F, class... T, size_t... K>
__device__ __forceinline__ auto call_at(const F& f, const Operand* o, const int64_t* off,
                                        std::index_sequence<K...>) {
  return f(static_cast<const T*>(o[K].data)[off[K]]...);
}

// The general path: operand offsets of output element i from its multi-index (one division per
// merged dimension, shared by the operands).
template <class F, class O, class... T>
__global__ void __launch_bounds__(kThreads)
    strided_kernel(F f, O* y, Dims d, int64_t n, Operands<sizeof...(T)> ops) {
  constexpr int kN = static_cast<int>(sizeof...(T));
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[kN] = {};
    int64_t rem = i;
    for (int k = d.rank - 1; k >= 0; --k) {
      const int64_t sz = d.size[k];
      const int64_t q = rem / sz, r = rem - q * sz;
#pragma unroll
      for (int m = 0; m < kN; ++m) off[m] += r * ops.o[m].stride[k];
      rem = q;
    }
    y[i] = call_at<F, T...>(f, ops.o, off, std::index_sequence_for<T...>{});
  }
}

inline constexpr size_t max_size(std::initializer_list<size_t> s) {
  size_t m = 1;
  for (size_t v : s) m = v > m ? v : m;
  return m;
}

inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Operand o's walk over merged dims of rank <= 2 (rank 0: one element; rank 1: one row).
template <class U>
Walk<U> walk_of(const Operand& o, int rank) {
  Walk<U> w{static_cast<const U*>(o.data), 0, 0};
  if (rank == 2) {
    w.rs = o.stride[0];
    w.cs = o.stride[1];
  } else if (rank == 1) {
    w.cs = o.stride[0];
  }
  return w;
}

template <int V, class F, class O, class... T, size_t... K>
cudaError_t launch_walk(cudaStream_t s, const F& f, O* y, const Dims& d, const Operand* ops,
                        std::index_sequence<K...>) {
  const int64_t rows = d.rank == 2 ? d.size[0] : 1;
  const int64_t cols = d.rank == 2 ? d.size[1] : (d.rank == 1 ? d.size[0] : 1);
  const int64_t cv = cols / V, tail = cols - cv * V;
  const int grid = grid_for(rows * cv > tail ? rows * cv : tail);
  const int64_t step = int64_t{grid} * kThreads;
  const int64_t step_r = cv > 0 ? step / cv : 0, step_c = cv > 0 ? step % cv : 0;
  walk_kernel<V, F, O, T...>
      <<<grid, kThreads, 0, s>>>(f, y, rows, cols, step_r, step_c, walk_of<T>(ops[K], d.rank)...);
  return cudaGetLastError();
}

// y = f(operands) over the merged dims d (n elements); ops[k] is the k-th operand (type T_k).
template <class O, class... T, class F>
cudaError_t elementwise(cudaStream_t s, const F& f, const Dims& d, void* yv, int64_t n,
                        const Operand* ops) {
  if (n == 0) return cudaSuccess;
  O* y = static_cast<O*>(yv);
  constexpr int kN = static_cast<int>(sizeof...(T));
  if (d.rank > 2) {
    Operands<kN> all;
    for (int k = 0; k < kN; ++k) all.o[k] = ops[k];
    strided_kernel<F, O, T...><<<blocks_for(n), kThreads, 0, s>>>(f, y, d, n, all);
    return cudaGetLastError();
  }
  // 16 bytes per access of the widest operand, where every operand allows it.
  constexpr int kV = static_cast<int>(16 / max_size({sizeof(O), sizeof(T)...}));
  if constexpr (kV > 1) {
    const int64_t rows = d.rank == 2 ? d.size[0] : 1;
    const int64_t cols = d.rank == 2 ? d.size[1] : (d.rank == 1 ? d.size[0] : 1);
    bool vec = aligned(y, sizeof(O) * kV) && (rows == 1 || cols % kV == 0);
    const size_t sizes[] = {sizeof(T)...};
    for (int k = 0; vec && k < kN; ++k) {
      const Walk<char> w = walk_of<char>(ops[k], d.rank);  // the strides
      if (w.cs == 0) continue;
      vec = w.cs == 1 && aligned(ops[k].data, sizes[k] * kV) && (rows == 1 || w.rs % kV == 0);
    }
    if (vec) return launch_walk<kV, F, O, T...>(s, f, y, d, ops, std::index_sequence_for<T...>{});
  }
  return launch_walk<1, F, O, T...>(s, f, y, d, ops, std::index_sequence_for<T...>{});
}

}  // namespace meshrt::cuda
