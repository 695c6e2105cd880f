// backends/cuda/cuda_kernels.h: launchers for the cuda backend's kernels (cuda_kernels.cu).
// Every launcher queues work on `stream` and returns; launch errors come back as cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace meshrt::cuda {

// Elementwise operands after the backend has merged contiguous dimensions.
inline constexpr int kMaxRank = 8;
struct Dims {
  int rank = 0;
  int64_t size[kMaxRank] = {};
};
struct Operand {
  const void* data = nullptr;
  int64_t stride[kMaxRank] = {};  // elements; 0 broadcasts
};

// Whether a float16 division divides through the divisor's reciprocal (as the cpu kernel): the
// divisor is broadcast along a dimension of size > 1 (stride 0 there; merging dimensions keeps
// such a dimension's stride 0, so merged and unmerged dims agree).
inline bool divisor_broadcast(int rank, const int64_t* size, const int64_t* stride) {
  bool b = false;
  for (int k = 0; k < rank; ++k) b |= size[k] > 1 && stride[k] == 0;
  return b;
}

// op: backend::UnaryOp as int (0 = copy/astype, in -> out).
cudaError_t launch_unary(cudaStream_t s, int op, DType in, DType out, const Dims& d,
                         const Operand& x, void* y, int64_t n);
// op: backend::BinaryOp as int; comparisons write bool.
cudaError_t launch_binary(cudaStream_t s, int op, DType in, DType out, const Dims& d,
                          const Operand& a, const Operand& b, void* y, int64_t n);
cudaError_t launch_select(cudaStream_t s, DType t, const Dims& d, const Operand& cond,
                          const Operand& a, const Operand& b, void* y, int64_t n);
// op: backend::ReduceOp as int. x dense [outer, len, inner] -> y [outer, inner].
cudaError_t launch_reduce(cudaStream_t s, int op, DType t, int64_t outer, int64_t len,
                          int64_t inner, const void* x, void* y);
cudaError_t launch_fill(cudaStream_t s, DType t, int64_t n, double value, bool iota, void* y);
// Every launcher takes every DType, bf16 and f16 included (computed in float32, rounded once per
// stored result; see cuda_kernels.cu).
//
// Integer (and bool-free) matmul without cuBLAS: c[b] = a[b] @ b[b], wrapping.
cudaError_t launch_int_matmul(cudaStream_t s, DType t, int64_t batch, int64_t m, int64_t n,
                              int64_t k, const void* a, const void* b, void* c);

// Collective folds over `rows` rows of `len` elements: dst[r][e] = fold(srcs[0][r][e], ...,
// srcs[count-1][r][e]) left to right (op = backend::FoldOp: sum, max, min; mean for bf16/f16
// only) in dtype t; row r of dst is r*dpitch elements in, of every source r*spitch. bf16/f16
// accumulate in float32 over all `count` sources and round once per output (a mean divides by
// count first): the cpu's fold_half bits. Launches of at most kMaxFoldSources sources each.
inline constexpr int kMaxFoldSources = 256;
cudaError_t launch_fold_rows(cudaStream_t s, int op, DType t, void* dst, int64_t dpitch,
                             const void* const* srcs, int64_t count, int64_t spitch, int64_t len,
                             int64_t rows);
// One fold of `nsrc` sources written to `ndst` outputs (each of len elements of dtype t, op as for
// launch_fold_rows, the same left-to-right order and bits): every source is read once, with
// 16-byte accesses (8 elements of bf16/f16) when every pointer is 16-byte aligned. An output may
// alias a source (each element is read from every source before it is written).
inline constexpr int kMaxFoldTo = 16;
cudaError_t launch_fold_to(cudaStream_t s, int op, DType t, void* const* dsts, int ndst,
                           const void* const* srcs, int nsrc, int64_t len);
// dst (out dtype) = sum (in dtype) / divisor, in out's precision (pmean); a bf16/f16 sum (out ==
// in) divides in float32 and rounds once.
cudaError_t launch_mean(cudaStream_t s, DType in, DType out, void* dst, const void* sum,
                        int64_t len, int64_t divisor);

}  // namespace meshrt::cuda
