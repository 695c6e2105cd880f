// backends/cuda/fused_kernels.cu: the fused elementwise kernels (fused_kernels.h), on the single-op
// kernels' walk (elementwise.cuh: 16 bytes per operand access where every operand is read along
// the row and aligned). The ops are chosen per launch (a switch every thread takes the same way);
// each is scalar_ops.h's definition, as in the single-op kernels, so a fused pair gives the pair's
// bits.
#include <cstdint>

#include "backends/cuda/elementwise.cuh"
#include "backends/cuda/fused_kernels.h"
#include "backends/op_codes.h"
#include "backends/scalar_ops.h"

namespace meshrt::cuda {
namespace {

namespace sc = backend::scalar;
using backend::BinaryOp;
using backend::code;

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

// y = uop(bop(u, v)).
template <class T>
struct BinaryUnaryFn {
  int bop, uop;
  __device__ __forceinline__ T operator()(T u, T v) const {
    return sc::unary(uop, arith(bop, u, v));
  }
};

// y = cmp(x0, x1) ? a : b.
template <class I, class T>
struct CompareSelectFn {
  int cmp;
  __device__ __forceinline__ T operator()(I x0, I x1, T a, T b) const {
    return compare(cmp, x0, x1) ? a : b;
  }
};

// The (rows, cols) walk as elementwise.cuh's rank-2 dims and operands.
Dims dims2(int64_t rows, int64_t cols) {
  Dims d;
  d.rank = 2;
  d.size[0] = rows;
  d.size[1] = cols;
  return d;
}
Operand operand(const Operand2& o) {
  Operand r;
  r.data = o.data;
  r.stride[0] = o.s0;
  r.stride[1] = o.s1;
  return r;
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
  const Operand ops[] = {operand(a), operand(b)};
  return float_type(t, [&](auto tv) {
    using T = decltype(tv);
    return elementwise<T, T, T>(s, BinaryUnaryFn<T>{bop, uop}, dims2(rows, cols), y, rows * cols,
                                ops);
  });
}

cudaError_t launch_compare_select(cudaStream_t s, int cmp, DType in, DType t, int64_t rows,
                                  int64_t cols, const Operand2& x0, const Operand2& x1,
                                  const Operand2& a, const Operand2& b, void* y) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const Operand ops[] = {operand(x0), operand(x1), operand(a), operand(b)};
  return float_type(in, [&](auto iv) {
    using I = decltype(iv);
    return float_type(t, [&](auto tv) {
      using T = decltype(tv);
      return elementwise<T, I, I, T, T>(s, CompareSelectFn<I, T>{cmp}, dims2(rows, cols), y,
                                        rows * cols, ops);
    });
  });
}

namespace {

// One warp per 32 bits of one row: lane l tests y[i][32 w + l], the ballot is word w of row i
// (bit l = lane l: bit b of a little-endian word is bit b % 8 of byte b / 8).
__global__ void relu_mask_kernel(int64_t m, int64_t n, int64_t words, const float* y,
                                 uint32_t* mask) {
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (warp >= m * words) return;  // whole warps leave together (blockDim is a multiple of 32)
  const int64_t i = warp / words, j = (warp % words) * 32 + lane;
  const bool on = j < n && y[i * n + j] > 0.0f;
  const uint32_t bits = __ballot_sync(0xffffffffu, on);
  if (lane == 0) mask[warp] = bits;
}

}  // namespace

cudaError_t launch_relu_mask(cudaStream_t s, int64_t m, int64_t n, int64_t ld, const float* y,
                             uint32_t* mask) {
  if (m == 0 || n == 0) return cudaSuccess;
  if (ld % 128 != 0 || ld < n) return cudaErrorInvalidValue;
  const int64_t words = ld / 32;  // per row of y
  constexpr int kThreads = 256;
  const int64_t blocks = (m * words * 32 + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  relu_mask_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(m, n, words, y, mask);
  return cudaGetLastError();
}

}  // namespace meshrt::cuda
