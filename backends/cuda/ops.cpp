// The cuda backend's op kernels (cuda_kernels.cu) and cuBLAS matmul, queued on the logical
// device's compute stream (cuda_backend.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/merge_dims.h"
#include "core/error.h"

namespace meshrt::cuda {
namespace {

// cuBLAS's workspace per logical device under MESHRT_CUDA_GRAPHS=1 (its default on Hopper).
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

// The kernels' operands: dimensions merged (backends/merge_dims.h) to at most kMaxRank.
struct Flat {
  Dims dims;
  std::vector<Operand> ops;
};
Flat flatten(const std::vector<int64_t>& shape, const std::vector<const backend::Strided*>& in) {
  std::vector<const std::vector<int64_t>*> strides;
  for (const backend::Strided* s : in) strides.push_back(&s->strides);
  const backend::MergedDims m = backend::merge_dims(shape, strides);
  if (m.size.size() > static_cast<size_t>(kMaxRank)) {
    throw Error("[cuda] an elementwise op over " + std::to_string(m.size.size()) +
                " non-mergeable dimensions exceeds the cuda kernels' limit of " +
                std::to_string(kMaxRank) +
                "; reshape or make the operand contiguous (e.g. copy it) first");
  }
  Flat f;
  f.dims.rank = static_cast<int>(m.size.size());
  for (size_t d = 0; d < m.size.size(); ++d) f.dims.size[d] = m.size[d];
  for (size_t i = 0; i < in.size(); ++i) {
    Operand o;
    o.data = in[i]->data;
    for (size_t d = 0; d < m.size.size(); ++d) o.stride[d] = m.strides[i][d];
    f.ops.push_back(o);
  }
  return f;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

void CudaBackend::unary(int device, backend::UnaryOp op, DType in, DType out,
                        const std::vector<int64_t>& shape, const backend::Strided& x, void* y) {
  const Flat f = flatten(shape, {&x});
  set(device);
  MESHRT_CUDA_CHECK(launch_unary(ops_stream(device), static_cast<int>(op), in, out, f.dims,
                                 f.ops[0], y, numel(shape)),
                    device);
}

void CudaBackend::binary(int device, backend::BinaryOp op, DType in, DType out,
                         const std::vector<int64_t>& shape, const backend::Strided& a,
                         const backend::Strided& b, void* y) {
  const Flat f = flatten(shape, {&a, &b});
  set(device);
  MESHRT_CUDA_CHECK(launch_binary(ops_stream(device), static_cast<int>(op), in, out, f.dims,
                                  f.ops[0], f.ops[1], y, numel(shape)),
                    device);
}

void CudaBackend::select(int device, DType dtype, const std::vector<int64_t>& shape,
                         const backend::Strided& cond, const backend::Strided& a,
                         const backend::Strided& b, void* y) {
  const Flat f = flatten(shape, {&cond, &a, &b});
  set(device);
  MESHRT_CUDA_CHECK(launch_select(ops_stream(device), dtype, f.dims, f.ops[0], f.ops[1], f.ops[2],
                                  y, numel(shape)),
                    device);
}

void CudaBackend::reduce(int device, backend::ReduceOp op, DType dtype, int64_t outer, int64_t len,
                         int64_t inner, const void* x, void* y) {
  set(device);
  MESHRT_CUDA_CHECK(
      launch_reduce(ops_stream(device), static_cast<int>(op), dtype, outer, len, inner, x, y),
      device);
}

void CudaBackend::matmul(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                         const void* a, const void* b, void* c) {
  matmul_t(device, dtype, batch, m, n, k, a, false, b, false, c);
}

void CudaBackend::matmul_t(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                           const void* a, bool trans_a, const void* b, bool trans_b, void* c) {
  gemm(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, c, Precision::highest);
}

void CudaBackend::matmul_prec(int device, DType dtype, int64_t batch, int64_t m, int64_t n,
                              int64_t k, const void* a, bool trans_a, const void* b, bool trans_b,
                              void* c, Precision precision) {
  gemm(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, c, precision);
}

void CudaBackend::gemm(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                       const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                       Precision precision) {
  if (batch == 0 || m == 0 || n == 0) return;
  if (lt_ && dtype == DType::f32 && batch == 1 && k > 0 &&
      lt_gemm(device, m, n, k, a, trans_a, b, trans_b, c, precision, nullptr, 0)) {
    return;  // MESHRT_CUDA_MATMUL=lt: the algorithm matmul_bias's epilogues use for this shape
  }
  Logical& l = dev(device);
  set(device);
  if (k == 0) {
    MESHRT_CUDA_CHECK(launch_fill(ops_stream(device), dtype, batch * m * n, 0.0, false, c), device);
    return;
  }
  if (dtype != DType::f32 && dtype != DType::f64 && !is_half(dtype)) {
    if (trans_a || trans_b) {  // the integer kernel reads dense operands: transposed copies first
      Backend::matmul_t(device, dtype, batch, m, n, k, a, trans_a, b, trans_b, c);
      return;
    }
    MESHRT_CUDA_CHECK(launch_int_matmul(ops_stream(device), dtype, batch, m, n, k, a, b, c),
                      device);
    return;
  }
  constexpr int64_t kIntMax = 2147483647;
  if (m > kIntMax || n > kIntMax || k > kIntMax || batch > kIntMax) {
    throw Error(
        "[cuda] matmul dimensions beyond 2^31-1 are not supported by cuBLAS's 32-bit interface");
  }
  std::lock_guard<std::mutex> lock(l.blas_mu);
  if (l.blas == nullptr) {
    MESHRT_CUBLAS_CHECK(cublasCreate(&l.blas), device);
    // A split-K reduction of a bf16/f16 product stays in float32 (by default cuBLAS may reduce in
    // the 16-bit output type, rounding more than once); the f32/f64 paths are unaffected.
    MESHRT_CUBLAS_CHECK(
        cublasSetMathMode(
            l.blas, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
        device);
  }
  MESHRT_CUBLAS_CHECK(cublasSetStream(l.blas, ops_stream(device)), device);
  if (graphs_) {
    // One workspace for eager and captured products (cublasSetStream resets it to cuBLAS's own
    // pool, which a capture would allocate from): the same algorithm, so the same bits.
    if (l.blas_workspace == nullptr) l.blas_workspace = allocate(device, kBlasWorkspaceBytes);
    MESHRT_CUBLAS_CHECK(
        cublasSetWorkspace(l.blas, l.blas_workspace->data(), l.blas_workspace->bytes()), device);
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: pass B first. A row-major
  // (r, c) matrix is column-major (c, r) with leading dimension c, so an operand stored as op(X)^T
  // (not transposed) is read with CUBLAS_OP_N and one stored as op(X) with CUBLAS_OP_T.
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = trans_b ? K : N;  // b stored (n, k) or (k, n)
  const int lda = trans_a ? M : K;  // a stored (k, m) or (m, k)
  if (is_half(dtype)) {
    // bf16/f16 operands and output, products accumulated in float32 (tensor cores), rounded once
    // to the output: the cpu's definition, though cuBLAS's summation order differs from the
    // cpu's, so the bits can differ by the rounding of that sum (docs/cuda.md states the bound).
    const cudaDataType_t t = dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const float one = 1.0f, zero = 0.0f;
    MESHRT_CUBLAS_CHECK(
        cublasGemmStridedBatchedEx(l.blas, op_b, op_a, N, M, K, &one, b, t, ldb, k * n, a, t, lda,
                                   m * k, &zero, c, t, N, m * n, static_cast<int>(batch),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        device);
  } else if (dtype == DType::f32 && precision == Precision::tf32) {
    // Tensor cores: operands rounded to TF32, products accumulated in f32 (JAX's GPU default).
    const float one = 1.0f, zero = 0.0f;
    MESHRT_CUBLAS_CHECK(
        cublasGemmStridedBatchedEx(l.blas, op_b, op_a, N, M, K, &one, b, CUDA_R_32F, ldb, k * n, a,
                                   CUDA_R_32F, lda, m * k, &zero, c, CUDA_R_32F, N, m * n,
                                   static_cast<int>(batch), CUBLAS_COMPUTE_32F_FAST_TF32,
                                   CUBLAS_GEMM_DEFAULT),
        device);
  } else if (dtype == DType::f32) {
    const float one = 1.0f, zero = 0.0f;
    MESHRT_CUBLAS_CHECK(
        cublasSgemmStridedBatched(l.blas, op_b, op_a, N, M, K, &one, static_cast<const float*>(b),
                                  ldb, k * n, static_cast<const float*>(a), lda, m * k, &zero,
                                  static_cast<float*>(c), N, m * n, static_cast<int>(batch)),
        device);
  } else {
    const double one = 1.0, zero = 0.0;
    MESHRT_CUBLAS_CHECK(
        cublasDgemmStridedBatched(l.blas, op_b, op_a, N, M, K, &one, static_cast<const double*>(b),
                                  ldb, k * n, static_cast<const double*>(a), lda, m * k, &zero,
                                  static_cast<double*>(c), N, m * n, static_cast<int>(batch)),
        device);
  }
}

void CudaBackend::fill(int device, DType dtype, int64_t n, double value, bool iota, void* y) {
  set(device);
  MESHRT_CUDA_CHECK(launch_fill(ops_stream(device), dtype, n, value, iota, y), device);
}

}  // namespace meshrt::cuda
