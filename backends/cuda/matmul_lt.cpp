// backends/cuda/matmul_lt.cpp: float32 products through cuBLASLt, and a layer's bias add and relu
// in the product's epilogue (MESHRT_CUDA_MATMUL=lt; CudaBackend::lt_gemm and matmul_bias).
//
// Bits. jit promises eager's bits, so a fused layer must give what its unfused calls give: the
// product rounded to float32, plus the bias (rounded once), then relu. Each logical device keeps
// one plan per product shape (sizes, transposes, precision, operand alignment): the algorithm
// cuBLASLt's heuristic ranks first for the RELU_BIAS epilogue among those that also run with no
// epilogue and with BIAS (cublasLtMatmulAlgoCheck). Every product of that shape, eager or fused,
// runs through that algorithm, so it accumulates in one order; with alpha 1 and beta 0 the
// epilogue adds the bias to that float32 sum and rounds once, as the add kernel does after it.
// Where no algorithm serves all three, the shape takes cuBLAS's classic GEMM and the unfused
// calls, eager and jitted alike. CudaKernels.LtEpiloguesGiveTheUnfusedBits checks all of this on
// a GPU (run-gpu.sh runs it with MESHRT_CUDA_MATMUL=lt).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstdint>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"

namespace meshrt::cuda {

namespace {

// cuBLASLt's workspace per logical device (NVIDIA's recommendation for Hopper).
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
// Heuristic candidates looked at per shape.
constexpr int kLtCandidates = 8;

// The alignment cuBLASLt may assume of a pointer: 16, 8 or 4 bytes.
int alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v % 16 == 0 ? 16 : v % 8 == 0 ? 8 : 4;
}

struct LtKey {
  int64_t m, n, k;
  bool trans_a, trans_b, tf32;
  int align_a, align_b, align_c;
  auto operator<=>(const LtKey&) const = default;
};

struct LtPlan {
  bool ok = false;
  cublasLtMatmulDesc_t desc[3] = {nullptr, nullptr, nullptr};  // none, BIAS, RELU_BIAS
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

// Frees what a plan that found no algorithm made (a plan that did is kept for the process).
void destroy(LtPlan& p) {
  for (cublasLtMatmulDesc_t& d : p.desc) {
    if (d != nullptr) cublasLtMatmulDescDestroy(d);
    d = nullptr;
  }
  for (cublasLtMatrixLayout_t* l : {&p.la, &p.lb, &p.lc}) {
    if (*l != nullptr) cublasLtMatrixLayoutDestroy(*l);
    *l = nullptr;
  }
}

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, T value, int device) {
  MESHRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)), device);
}

// A plan for `key` on handle `lt`: descriptors for the three epilogues, the operand layouts and
// the algorithm all three accept (ok false when there is none).
LtPlan make_plan(cublasLtHandle_t lt, const LtKey& key, int device) {
  LtPlan p;
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // As gemm (ops.cpp): the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
  // so cuBLASLt's A is our b, its B our a, and D is column-major (n, m) with leading dimension n:
  // its rows are our columns, so the epilogue's bias (one value per row of D, broadcast over its
  // columns) is our bias row.
  const cublasOperation_t op_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogues[3] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                                           CUBLASLT_EPILOGUE_RELU_BIAS};
  for (int e = 0; e < 3; ++e) {
    MESHRT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc[e], compute, CUDA_R_32F), device);
    set_desc(p.desc[e], CUBLASLT_MATMUL_DESC_TRANSA, op_b, device);
    set_desc(p.desc[e], CUBLASLT_MATMUL_DESC_TRANSB, op_a, device);
    set_desc(p.desc[e], CUBLASLT_MATMUL_DESC_EPILOGUE, epilogues[e], device);
    if (e > 0) set_desc(p.desc[e], CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_32F, device);
  }
  const uint64_t m = static_cast<uint64_t>(key.m), n = static_cast<uint64_t>(key.n),
                 k = static_cast<uint64_t>(key.k);
  // A layout names the stored matrix (rows, columns, leading dimension) before op().
  MESHRT_CUBLAS_CHECK(key.trans_b ? cublasLtMatrixLayoutCreate(&p.la, CUDA_R_32F, k, n, key.k)
                                  : cublasLtMatrixLayoutCreate(&p.la, CUDA_R_32F, n, k, key.n),
                      device);
  MESHRT_CUBLAS_CHECK(key.trans_a ? cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_32F, m, k, key.m)
                                  : cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_32F, k, m, key.k),
                      device);
  MESHRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, CUDA_R_32F, n, m, key.n), device);

  cublasLtMatmulPreference_t pref = nullptr;
  MESHRT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), device);
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    MESHRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
                        device);
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kLtWorkspaceBytes));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(key.align_b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(key.align_a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(key.align_c));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(key.align_c));
  cublasLtMatmulHeuristicResult_t found[kLtCandidates] = {};
  int count = 0;
  // No algorithm (CUBLAS_STATUS_NOT_SUPPORTED, or none returned) is not an error: the shape takes
  // the classic GEMM.
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p.desc[2], p.la, p.lb, p.lc, p.lc,
                                                           pref, kLtCandidates, found, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
    destroy(p);
    throw_cublas(st, "cublasLtMatmulAlgoGetHeuristic", device);
  }
  for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < count && !p.ok; ++i) {
    if (found[i].state != CUBLAS_STATUS_SUCCESS || found[i].workspaceSize > kLtWorkspaceBytes)
      continue;
    size_t workspace = found[i].workspaceSize;
    bool all = true;
    for (int e = 0; e < 2 && all; ++e) {
      cublasLtMatmulHeuristicResult_t check{};
      all = cublasLtMatmulAlgoCheck(lt, p.desc[e], p.la, p.lb, p.lc, p.lc, &found[i].algo,
                                    &check) == CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= kLtWorkspaceBytes;
      if (all && check.workspaceSize > workspace) workspace = check.workspaceSize;
    }
    if (!all) continue;
    p.ok = true;
    p.algo = found[i].algo;
    p.workspace = workspace;
  }
  if (!p.ok) destroy(p);
  return p;
}

}  // namespace

struct LtPlans {
  std::map<LtKey, LtPlan> plans;
};

bool CudaBackend::lt_gemm(int device, int64_t m, int64_t n, int64_t k, const void* a, bool trans_a,
                          const void* b, bool trans_b, void* c, Precision precision,
                          const void* bias, int epilogue) {
  if (epilogue > 0 && (bias == nullptr || alignment(bias) < 16)) return false;
  Logical& l = dev(device);
  set(device);
  std::lock_guard<std::mutex> lock(l.blas_mu);
  if (l.lt == nullptr) {
    MESHRT_CUBLAS_CHECK(cublasLtCreate(&l.lt), device);
    l.lt_plans = std::make_shared<LtPlans>();
  }
  const LtKey key{
      m,           n, k, trans_a, trans_b, precision == Precision::tf32, alignment(a), alignment(b),
      alignment(c)};
  auto it = l.lt_plans->plans.find(key);
  if (it == l.lt_plans->plans.end())
    it = l.lt_plans->plans.emplace(key, make_plan(l.lt, key, device)).first;
  LtPlan& p = it->second;
  if (!p.ok) return false;
  if (p.workspace > 0 && l.lt_workspace == nullptr)
    l.lt_workspace = allocate(device, kLtWorkspaceBytes);
  if (epilogue > 0) set_desc(p.desc[epilogue], CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, device);
  const float one = 1.0f, zero = 0.0f;
  MESHRT_CUBLAS_CHECK(
      cublasLtMatmul(l.lt, p.desc[epilogue], &one, b, p.la, a, p.lb, &zero, c, p.lc, c, p.lc,
                     &p.algo, p.workspace > 0 ? l.lt_workspace->data() : nullptr, p.workspace,
                     l.compute),
      device);
  if (epilogue > 0) fused_matmul_bias_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void CudaBackend::matmul_bias(int device, DType dtype, int64_t m, int64_t n, int64_t k,
                              const void* a, bool trans_a, const void* b, bool trans_b,
                              Precision precision, const void* bias, bool relu, void* y) {
  if (lt_ && dtype == DType::f32 && m > 0 && n > 0 && k > 0 &&
      lt_gemm(device, m, n, k, a, trans_a, b, trans_b, y, precision, bias, relu ? 2 : 1)) {
    return;
  }
  // The unfused calls: the product (through this shape's plan, as eager) then the bias add.
  Backend::matmul_bias(device, dtype, m, n, k, a, trans_a, b, trans_b, precision, bias, relu, y);
}

}  // namespace meshrt::cuda
