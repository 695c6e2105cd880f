// backends/cuda/fused_kernels.h: two elementwise ops in one pass (fused_kernels.cu), for jit's
// fused kernel calls (Backend::binary_unary, Backend::compare_select): the intermediate never
// goes to memory, and each op rounds exactly as its own kernel does, so the bits are unchanged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace meshrt::cuda {

// An operand over a (rows, cols) output: element (r, c) at data + r * s0 + c * s1 (elements; 0
// broadcasts). rows is 1 for a rank-1 walk.
struct Operand2 {
  const void* data = nullptr;
  int64_t s0 = 0, s1 = 0;
};

// y = uop(bop(a, b)), t float32 or float64 (others: cudaErrorNotSupported); bop: BinaryOp
// add..min by code, uop: UnaryOp by code.
cudaError_t launch_binary_unary(cudaStream_t s, int bop, int uop, DType t, int64_t rows,
                                int64_t cols, const Operand2& a, const Operand2& b, void* y);
// y = cmp(x0, x1) ? a : b: x0, x1 of `in`, a, b, y of `t` (each float32 or float64).
cudaError_t launch_compare_select(cudaStream_t s, int cmp, DType in, DType t, int64_t rows,
                                  int64_t cols, const Operand2& x0, const Operand2& x1,
                                  const Operand2& a, const Operand2& b, void* y);

// cuBLASLt's relu bit mask of a row-major (m, n) float32 y (the forward's relu output), for the
// DRELU epilogue (matmul_lt.cpp): bit i * ld + j set where y[i][j] > 0 (NaN: clear), element
// (j, i) of the column-major (n, m) output cuBLASLt sees, ld (a multiple of 128, at least n)
// bits per column, bit b of the buffer in byte b / 8 at position b % 8, the bits past n clear.
// mask holds m * ld / 8 bytes, 4-byte aligned.
cudaError_t launch_relu_mask(cudaStream_t s, int64_t m, int64_t n, int64_t ld, const float* y,
                             uint32_t* mask);

}  // namespace meshrt::cuda
