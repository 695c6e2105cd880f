// The cuda backend's kernels. Element semantics come from backends/scalar_ops.h, the same
// definitions the cpu kernels use; loops are grid-stride over the output.
#include <type_traits>
#include <utility>

#include "backends/cuda/cuda_kernels.h"
#include "backends/scalar_ops.h"

namespace meshrt::cuda {
namespace {

namespace sc = meshrt::backend::scalar;

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 8 ? (b < 1 ? 1 : b) : 65535 * 8);
}

template <class F>
cudaError_t with_type(DType t, F&& f) {
  return sc::visit_dtype(t, std::forward<F>(f));
}

// Offset of output element i in an operand (row-major multi-index times the strides).
__device__ __forceinline__ int64_t offset_of(const Dims& d, const int64_t* stride, int64_t i) {
  int64_t off = 0;
  for (int k = d.rank - 1; k >= 0; --k) {
    const int64_t sz = d.size[k];
    off += (i % sz) * stride[k];
    i /= sz;
  }
  return off;
}

template <class I, class O>
__global__ void unary_kernel(int op, Dims d, Operand x, O* y, int64_t n) {
  const I* xp = static_cast<const I*>(x.data);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const I v = xp[offset_of(d, x.stride, i)];
    if (op == 0) {
      y[i] = sc::convert<O>(v);
    } else if constexpr (std::is_same_v<I, O>) {
      y[i] = sc::unary(op, v);
    }
  }
}

// backend::BinaryOp: add, sub, mul, div, max, min, eq, ne, lt, le, gt, ge.
template <class I>
__device__ __forceinline__ I arith(int op, I u, I v) {
  switch (op) {
    case 0:
      return sc::wrap_add(u, v);
    case 1:
      return sc::wrap_sub(u, v);
    case 2:
      return sc::wrap_mul(u, v);
    case 3:
      if constexpr (std::is_floating_point_v<I>)
        return u / v;
      else
        return I(0);  // the runtime divides integers in floating point; never reached
    case 4:
      return sc::max_nan(u, v);
    default:
      return sc::min_nan(u, v);
  }
}
template <class I>
__device__ __forceinline__ bool compare(int op, I u, I v) {
  switch (op) {
    case 6:
      return u == v;
    case 7:
      return u != v;
    case 8:
      return u < v;
    case 9:
      return u <= v;
    case 10:
      return u > v;
    default:
      return u >= v;
  }
}

template <class I>
__global__ void binary_kernel(int op, Dims d, Operand a, Operand b, void* y, int64_t n) {
  const I* ap = static_cast<const I*>(a.data);
  const I* bp = static_cast<const I*>(b.data);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const I u = ap[offset_of(d, a.stride, i)], v = bp[offset_of(d, b.stride, i)];
    if (op >= 6)
      static_cast<bool*>(y)[i] = compare(op, u, v);
    else
      static_cast<I*>(y)[i] = arith(op, u, v);
  }
}

template <class T>
__global__ void select_kernel(Dims d, Operand c, Operand a, Operand b, T* y, int64_t n) {
  const bool* cp = static_cast<const bool*>(c.data);
  const T* ap = static_cast<const T*>(a.data);
  const T* bp = static_cast<const T*>(b.data);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = cp[offset_of(d, c.stride, i)] ? ap[offset_of(d, a.stride, i)]
                                         : bp[offset_of(d, b.stride, i)];
  }
}

// One thread per output (o, i), folding over len in order (the cpu kernel's order).
template <class T>
__global__ void reduce_kernel(int op, int64_t outer, int64_t len, int64_t inner, const T* x,
                              void* y) {
  const int64_t rows = outer * inner;
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = r / inner, i = r % inner;
    const T* base = x + o * len * inner + i;
    if (op == 3) {  // argmax
      T best = base[0];
      int64_t at = 0;
      for (int64_t l = 1; l < len; ++l) {
        const T v = base[l * inner];
        if (sc::argmax_better(best, v)) {
          best = v;
          at = l;
        }
      }
      static_cast<int64_t*>(y)[r] = at;
      continue;
    }
    T acc = len == 0 ? T(0) : base[0];
    for (int64_t l = 1; l < len; ++l) {
      const T v = base[l * inner];
      acc = op == 0 ? sc::wrap_add(acc, v) : op == 1 ? sc::max_nan(acc, v) : sc::min_nan(acc, v);
    }
    static_cast<T*>(y)[r] = acc;
  }
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

// Element (r, e) of `rows` rows of `len`: dst at r*dpitch + e, every source at r*spitch + e.
template <class T>
__global__ void fold_kernel(int op, T* dst, int64_t dpitch, Sources s, int count, int64_t spitch,
                            int64_t len, int64_t rows, bool accumulate) {
  const int64_t total = len * rows;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / len, e = i % len;
    T* d = dst + r * dpitch + e;
    const int64_t at = r * spitch + e;
    T acc = accumulate ? *d : static_cast<const T*>(s.p[0])[at];
    for (int j = accumulate ? 0 : 1; j < count; ++j) {
      const T v = static_cast<const T*>(s.p[j])[at];
      acc = op == 0 ? sc::wrap_add(acc, v) : op == 1 ? sc::fold_max(acc, v) : sc::fold_min(acc, v);
    }
    *d = acc;
  }
}

template <class I, class O>
__global__ void mean_kernel(O* dst, const I* sum, int64_t len, int64_t divisor) {
  const O d = static_cast<O>(divisor);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < len;
       e += int64_t{gridDim.x} * blockDim.x) {
    dst[e] = static_cast<O>(sum[e]) / d;
  }
}

}  // namespace

cudaError_t launch_unary(cudaStream_t s, int op, DType in, DType out, const Dims& d,
                         const Operand& x, void* y, int64_t n) {
  if (n == 0) return cudaSuccess;
  return with_type(in, [&](auto iv) {
    using I = decltype(iv);
    return with_type(out, [&](auto ov) {
      using O = decltype(ov);
      unary_kernel<I, O><<<blocks_for(n), kThreads, 0, s>>>(op, d, x, static_cast<O*>(y), n);
      return cudaGetLastError();
    });
  });
}

cudaError_t launch_binary(cudaStream_t s, int op, DType in, DType, const Dims& d, const Operand& a,
                          const Operand& b, void* y, int64_t n) {
  if (n == 0) return cudaSuccess;
  return with_type(in, [&](auto iv) {
    using I = decltype(iv);
    binary_kernel<I><<<blocks_for(n), kThreads, 0, s>>>(op, d, a, b, y, n);
    return cudaGetLastError();
  });
}

cudaError_t launch_select(cudaStream_t s, DType t, const Dims& d, const Operand& cond,
                          const Operand& a, const Operand& b, void* y, int64_t n) {
  if (n == 0) return cudaSuccess;
  return with_type(t, [&](auto tv) {
    using T = decltype(tv);
    select_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(d, cond, a, b, static_cast<T*>(y), n);
    return cudaGetLastError();
  });
}

cudaError_t launch_reduce(cudaStream_t s, int op, DType t, int64_t outer, int64_t len,
                          int64_t inner, const void* x, void* y) {
  const int64_t rows = outer * inner;
  if (rows == 0) return cudaSuccess;
  return with_type(t, [&](auto tv) {
    using T = decltype(tv);
    if constexpr (std::is_same_v<T, bool>) {
      return cudaErrorInvalidValue;  // the runtime converts bool to an integer first
    } else {
      reduce_kernel<T><<<blocks_for(rows), kThreads, 0, s>>>(op, outer, len, inner,
                                                             static_cast<const T*>(x), y);
      return cudaGetLastError();
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
    if constexpr (std::is_same_v<T, bool>) {
      return cudaErrorInvalidValue;
    } else {
      int_matmul_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(
          batch, m, n, k, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c));
      return cudaGetLastError();
    }
  });
}

cudaError_t launch_fold_rows(cudaStream_t s, int op, DType t, void* dst, int64_t dpitch,
                             const void* const* srcs, int count, int64_t spitch, int64_t len,
                             int64_t rows, bool accumulate) {
  if (len == 0 || rows == 0) return cudaSuccess;
  if (count < 1 || count > kMaxFoldSources) return cudaErrorInvalidValue;
  Sources src{};
  for (int j = 0; j < count; ++j) src.p[j] = srcs[j];
  return with_type(t, [&](auto tv) {
    using T = decltype(tv);
    fold_kernel<T><<<blocks_for(len * rows), kThreads, 0, s>>>(
        op, static_cast<T*>(dst), dpitch, src, count, spitch, len, rows, accumulate);
    return cudaGetLastError();
  });
}

cudaError_t launch_mean(cudaStream_t s, DType in, DType out, void* dst, const void* sum,
                        int64_t len, int64_t divisor) {
  if (len == 0) return cudaSuccess;
  return with_type(in, [&](auto iv) {
    using I = decltype(iv);
    if (out == DType::f32) {
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
