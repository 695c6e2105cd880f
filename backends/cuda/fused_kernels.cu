// backends/cuda/fused_kernels.cu: the fused elementwise kernels (fused_kernels.h). The ops are
// chosen per launch (a switch every thread takes the same way); each is scalar_ops.h's
// definition, as in the single-op kernels, so a fused pair gives the pair's bits.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/fused_kernels.h"
#include "backends/op_codes.h"
#include "backends/scalar_ops.h"

namespace meshrt::cuda {
namespace {

namespace sc = backend::scalar;
using backend::BinaryOp;
using backend::code;

constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ T arith(int op, T u, T v) {
  switch (op) {
    case code(BinaryOp::add):
      return u + v;
    case code(BinaryOp::sub):
      return u - v;
    case code(BinaryOp::mul):
      return u * v;
    case code(BinaryOp::div):
      return u / v;
    case code(BinaryOp::max):
      return sc::max_nan(u, v);
    default:
      return sc::min_nan(u, v);
  }
}

template <class T>
__device__ __forceinline__ bool compare(int op, T u, T v) {
  switch (op) {
    case code(BinaryOp::eq):
      return u == v;
    case code(BinaryOp::ne):
      return u != v;
    case code(BinaryOp::lt):
      return u < v;
    case code(BinaryOp::le):
      return u <= v;
    case code(BinaryOp::gt):
      return u > v;
    default:
      return u >= v;
  }
}

template <class T>
__device__ __forceinline__ T at(const Operand2& o, int64_t r, int64_t c) {
  return static_cast<const T*>(o.data)[r * o.s0 + c * o.s1];
}

// Rows over blockIdx.y (grid-stride), columns over x: no division per element.
template <class T>
__global__ void __launch_bounds__(kThreads)
    binary_unary_kernel(int bop, int uop, int64_t rows, int64_t cols, Operand2 a, Operand2 b,
                        T* y) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      y[r * cols + c] = sc::unary(uop, arith(bop, at<T>(a, r, c), at<T>(b, r, c)));
    }
  }
}

template <class I, class T>
__global__ void __launch_bounds__(kThreads)
    compare_select_kernel(int cmp, int64_t rows, int64_t cols, Operand2 x0, Operand2 x1, Operand2 a,
                          Operand2 b, T* y) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      y[r * cols + c] =
          compare(cmp, at<I>(x0, r, c), at<I>(x1, r, c)) ? at<T>(a, r, c) : at<T>(b, r, c);
    }
  }
}

// About 8 resident blocks per multiprocessor on an H100/H200 (132 of them), columns first.
dim3 grid_for(int64_t rows, int64_t cols) {
  const int64_t x = std::clamp<int64_t>((cols + kThreads - 1) / kThreads, 1, 1024);
  const int64_t y = std::clamp<int64_t>(1056 / x, 1, std::min<int64_t>(rows, 65535));
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
}

template <class F>
cudaError_t float_type(DType t, F&& f) {
  if (t == DType::f32) return f(float{});
  if (t == DType::f64) return f(double{});
  return cudaErrorNotSupported;
}

}  // namespace

cudaError_t launch_binary_unary(cudaStream_t s, int bop, int uop, DType t, int64_t rows,
                                int64_t cols, const Operand2& a, const Operand2& b, void* y) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return float_type(t, [&](auto tv) {
    using T = decltype(tv);
    binary_unary_kernel<T>
        <<<grid_for(rows, cols), kThreads, 0, s>>>(bop, uop, rows, cols, a, b, static_cast<T*>(y));
    return cudaGetLastError();
  });
}

cudaError_t launch_compare_select(cudaStream_t s, int cmp, DType in, DType t, int64_t rows,
                                  int64_t cols, const Operand2& x0, const Operand2& x1,
                                  const Operand2& a, const Operand2& b, void* y) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return float_type(in, [&](auto iv) {
    using I = decltype(iv);
    return float_type(t, [&](auto tv) {
      using T = decltype(tv);
      compare_select_kernel<I, T><<<grid_for(rows, cols), kThreads, 0, s>>>(
          cmp, rows, cols, x0, x1, a, b, static_cast<T*>(y));
      return cudaGetLastError();
    });
  });
}

}  // namespace meshrt::cuda
