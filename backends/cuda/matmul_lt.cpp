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
// calls, eager and jitted alike. Split-K algorithms are held to reductions in a separate float32
// buffer (where a bias meets parts summed in place in the output is not documented). cuBLASLt
// documents its relu as max(x, 0) and says nothing of NaN, while relu keeps NaN (JAX): the first
// fused relu of each shape runs once on zero operands with a NaN bias, and where the NaN does not
// survive, that shape's relu runs as its own kernel after the BIAS epilogue (the same bits, one
// pass more). CudaKernels.LtEpiloguesGiveTheUnfusedBits checks all of this on a GPU (run-gpu.sh
// runs it with MESHRT_CUDA_MATMUL=lt).
//
// relu's gradient (matmul_drelu: where(y > 0, a @ b, 0), the backward of a layer) runs as the
// DRELU epilogue of the same plan's algorithm, fed a relu bit mask one small kernel makes from the
// forward's output y (launch_relu_mask). Neither the mask's bit order nor what DRELU writes where
// a bit is clear (0 as a select, or the product times 0, which keeps a NaN) is spelled out in
// cublasLt.h, nor that the algorithm sums in the same order under DRELU, so the first call of
// each shape runs the fused and the unfused calls on the same operands twice (NaN, infinities
// and signed numbers among the products with y positive, zero, negative and NaN; then random
// finite operands: drelu_matches) and fuses that shape only where both agree bit for bit
// (CudaKernels.LtDreluGivesTheUnfusedBits).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cmath>
#include <compare>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fused_kernels.h"

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
  // The epilogues ran (false once cublasLtMatmul refused one: that shape's layers run unfused).
  bool epilogues = true;
  // Whether RELU_BIAS keeps a NaN as relu does (JAX: relu(NaN) = NaN): probed on first use
  // (relu_probe); where it does not, relu runs after the BIAS epilogue as its own kernel.
  enum class Relu { unknown, fused, separate } relu = Relu::unknown;
  // DRELU (matmul_drelu): its descriptor, the workspace it asks, and whether the algorithm runs it
  // with the unfused calls' bits (drelu_matches, on first use); the relu mask it reads, kept with
  // the plan (a captured graph holds its address).
  enum class Drelu { unknown, fused, separate } drelu = Drelu::unknown;
  cublasLtMatmulDesc_t drelu_desc = nullptr;
  size_t drelu_workspace = 0;
  std::shared_ptr<backend::Buffer> mask;
};

// Frees what a plan that found no algorithm made (a plan that did is kept for the process).
void destroy(LtPlan& p) {
  for (cublasLtMatmulDesc_t& d : p.desc) {
    if (d != nullptr) cublasLtMatmulDescDestroy(d);
    d = nullptr;
  }
  if (p.drelu_desc != nullptr) cublasLtMatmulDescDestroy(p.drelu_desc);
  p.drelu_desc = nullptr;
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
LtPlan make_plan_or_throw(cublasLtHandle_t lt, const LtKey& key, int device, LtPlan& p) {
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
    if (e > 0) {
      set_desc(p.desc[e], CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_32F, device);
      // The heuristic reads the bias pointer's alignment (never the memory): a stand-in aligned
      // to 16 bytes and no more, the least lt_gemm passes to an epilogue.
      set_desc(p.desc[e], CUBLASLT_MATMUL_DESC_BIAS_POINTER,
               static_cast<const void*>(reinterpret_cast<const char*>(16)), device);
    }
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
  struct PrefGuard {
    cublasLtMatmulPreference_t& p;
    ~PrefGuard() {
      if (p != nullptr) cublasLtMatmulPreferenceDestroy(p);
    }
  } pref_guard{pref};
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    MESHRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
                        device);
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kLtWorkspaceBytes));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(key.align_b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(key.align_a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(key.align_c));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(key.align_c));
  // A split-K algorithm reduces its parts in a float32 buffer, not in place in the output: where
  // the epilogue's bias meets a part summed in place is not documented, so the bits could differ.
  set_pref(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
           static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                 CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE));
  cublasLtMatmulHeuristicResult_t found[kLtCandidates] = {};
  int count = 0;
  // No algorithm (CUBLAS_STATUS_NOT_SUPPORTED, or none returned) is not an error: the shape takes
  // the classic GEMM.
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p.desc[2], p.la, p.lb, p.lc, p.lc,
                                                           pref, kLtCandidates, found, &count);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
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

LtPlan make_plan(cublasLtHandle_t lt, const LtKey& key, int device) {
  LtPlan p;
  try {
    return make_plan_or_throw(lt, key, device, p);
  } catch (...) {
    destroy(p);
    throw;
  }
}

// Operands a relu probe may allocate (the shape's own a, b, output and bias).
constexpr size_t kProbeBytes = size_t{256} << 20;

// Whether `p`'s RELU_BIAS keeps a NaN as relu does: one run of the shape on zero operands with a
// NaN bias, its first output read back (the host waits, once per shape). A shape whose operands
// exceed kProbeBytes is not probed (relu then runs as its own kernel).
bool relu_keeps_nan(CudaBackend& be, Logical& l, int device, const LtKey& key, LtPlan& p,
                    void* workspace) {
  const size_t na = static_cast<size_t>(key.m * key.k) * 4,
               nb = static_cast<size_t>(key.k * key.n) * 4,
               nc = static_cast<size_t>(key.m * key.n) * 4, nbias = static_cast<size_t>(key.n) * 4;
  if (na + nb + nc + nbias > kProbeBytes) return false;
  const auto a = be.allocate(device, na), b = be.allocate(device, nb), c = be.allocate(device, nc),
             bias = be.allocate(device, nbias);
  MESHRT_CUDA_CHECK(cudaMemsetAsync(a->data(), 0, na, l.compute), device);
  MESHRT_CUDA_CHECK(cudaMemsetAsync(b->data(), 0, nb, l.compute), device);
  MESHRT_CUDA_CHECK(cudaMemsetAsync(bias->data(), 0xff, nbias, l.compute), device);  // NaNs
  set_desc(p.desc[2], CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias->data()),
           device);
  const float one = 1.0f, zero = 0.0f;
  if (cublasLtMatmul(l.lt, p.desc[2], &one, b->data(), p.la, a->data(), p.lb, &zero, c->data(),
                     p.lc, c->data(), p.lc, &p.algo, workspace, p.workspace,
                     l.compute) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  float first = 0.0f;
  MESHRT_CUDA_CHECK(
      cudaMemcpyAsync(&first, c->data(), sizeof(float), cudaMemcpyDeviceToHost, l.compute), device);
  MESHRT_CUDA_CHECK(cudaStreamSynchronize(l.compute), device);
  return first != first;
}

// The relu mask's leading dimension: bits per column of cuBLASLt's column-major (n, m) output.
int64_t mask_ld(int64_t n) { return (n + 127) / 128 * 128; }

size_t mask_bytes(int64_t m, int64_t n) { return static_cast<size_t>(m * mask_ld(n) / 8); }

// p's DRELU descriptor, when p's algorithm runs DRELU for `key` (cublasLtMatmulAlgoCheck) within
// the workspace. False: the shape's relu gradients run unfused.
bool make_drelu_desc(cublasLtHandle_t lt, const LtKey& key, LtPlan& p, int device) {
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (p.drelu_desc == nullptr) {  // (once: a probe that threw leaves it for the next call)
    MESHRT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.drelu_desc, compute, CUDA_R_32F), device);
  }
  set_desc(p.drelu_desc, CUBLASLT_MATMUL_DESC_TRANSA, key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
           device);
  set_desc(p.drelu_desc, CUBLASLT_MATMUL_DESC_TRANSB, key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
           device);
  set_desc(p.drelu_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DRELU, device);
  set_desc(p.drelu_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, mask_ld(key.n), device);
  // As the bias pointer in make_plan: a stand-in of the alignment the mask buffer has (256).
  set_desc(p.drelu_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
           static_cast<void*>(reinterpret_cast<char*>(256)), device);
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(lt, p.drelu_desc, p.la, p.lb, p.lc, p.lc, &p.algo, &check) !=
          CUBLAS_STATUS_SUCCESS ||
      check.workspaceSize > kLtWorkspaceBytes) {
    return false;
  }
  p.drelu_workspace = check.workspaceSize;
  return true;
}

// Whether p's DRELU gives the unfused calls' bits for `key`: the plain product through p, then
// relu's gradient as its own kernel (compare_select), against the relu mask and DRELU, on the
// same operands, twice. First the products are NaN, both infinities, zeros and numbers of either
// sign along both dimensions (a's columns 0 and 1 and b's rows 0 and 1 hold values whose two-term
// sums are exact, the rest zeros), y positive, zero, negative and NaN: what DRELU writes where a
// bit is clear, and the mask's bit order. Then pseudo-random finite operands whose magnitudes span
// 2^-20 .. 2^20: the order of the sums. The host waits, once per shape. Makes p.mask. Shapes with
// k < 2 or fewer than 16 outputs (too small to tell a select from a product with 0), and shapes
// whose operands exceed kProbeBytes, are not probed: their relu gradients run unfused.
bool drelu_matches(CudaBackend& be, Logical& l, int device, const LtKey& key, LtPlan& p,
                   void* workspace) {
  const int64_t m = key.m, n = key.n, k = key.k;
  if (k < 2 || m * n < 16) return false;
  const size_t na = static_cast<size_t>(m * k), nb = static_cast<size_t>(k * n),
               nc = static_cast<size_t>(m * n);
  if ((na + nb + 3 * nc) * 4 + mask_bytes(m, n) > kProbeBytes) return false;
  // Element (r, c) of a logical (rows, cols) operand, stored transposed or not.
  auto at = [](bool trans, int64_t r, int64_t c, int64_t rows, int64_t cols) {
    return static_cast<size_t>(trans ? c * rows + r : r * cols + c);
  };
  const cudaStream_t s = be.ops_stream(device);
  const auto a = be.allocate(device, na * 4), b = be.allocate(device, nb * 4),
             y = be.allocate(device, nc * 4), unfused = be.allocate(device, nc * 4),
             fused = be.allocate(device, nc * 4), zero = be.allocate(device, 4);
  if (p.mask == nullptr) p.mask = be.allocate(device, mask_bytes(m, n));
  const float one = 1.0f, nought = 0.0f;
  const std::vector<int64_t> shape{m, n};
  const backend::Strided g{unfused->data(), {n, 1}}, z{zero->data(), {0, 0}},
      out{y->data(), {n, 1}};
  auto same_bits = [&](const std::vector<float>& ha, const std::vector<float>& hb,
                       const std::vector<float>& hy) {
    MESHRT_CUDA_CHECK(cudaMemcpyAsync(a->data(), ha.data(), na * 4, cudaMemcpyHostToDevice, s),
                      device);
    MESHRT_CUDA_CHECK(cudaMemcpyAsync(b->data(), hb.data(), nb * 4, cudaMemcpyHostToDevice, s),
                      device);
    MESHRT_CUDA_CHECK(cudaMemcpyAsync(y->data(), hy.data(), nc * 4, cudaMemcpyHostToDevice, s),
                      device);
    MESHRT_CUDA_CHECK(cudaMemsetAsync(zero->data(), 0, 4, s), device);  // +0.0f
    if (cublasLtMatmul(l.lt, p.desc[0], &one, b->data(), p.la, a->data(), p.lb, &nought,
                       unfused->data(), p.lc, unfused->data(), p.lc, &p.algo, workspace,
                       p.workspace, s) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    be.compare_select(device, backend::BinaryOp::gt, DType::f32, DType::f32, shape, out, z, g, z,
                      unfused->data());
    MESHRT_CUDA_CHECK(launch_relu_mask(s, m, n, mask_ld(n), static_cast<const float*>(y->data()),
                                       static_cast<uint32_t*>(p.mask->data())),
                      device);
    set_desc(p.drelu_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.mask->data(), device);
    if (cublasLtMatmul(l.lt, p.drelu_desc, &one, b->data(), p.la, a->data(), p.lb, &nought,
                       fused->data(), p.lc, fused->data(), p.lc, &p.algo, workspace,
                       p.drelu_workspace, s) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    std::vector<float> hu(nc), hf(nc);
    MESHRT_CUDA_CHECK(
        cudaMemcpyAsync(hu.data(), unfused->data(), nc * 4, cudaMemcpyDeviceToHost, s), device);
    MESHRT_CUDA_CHECK(cudaMemcpyAsync(hf.data(), fused->data(), nc * 4, cudaMemcpyDeviceToHost, s),
                      device);
    MESHRT_CUDA_CHECK(cudaStreamSynchronize(s), device);
    return std::memcmp(hu.data(), hf.data(), nc * 4) == 0;
  };
  // Round 1: product (i, j) = values[i % 8] + values[(j + 3) % 8], exact in any order.
  const float inf = __builtin_huge_valf(), nan = __builtin_nanf("");
  const float values[8] = {1.0f, -2.0f, nan, inf, -inf, 3.0f, 0.5f, -0.25f};
  const float ys[5] = {1.0f, 0.0f, -1.0f, nan, 2.0f};
  std::vector<float> ha(na, 0.0f), hb(nb, 0.0f), hy(nc);
  for (int64_t i = 0; i < m; ++i) {
    ha[at(key.trans_a, i, 0, m, k)] = values[i % 8];
    ha[at(key.trans_a, i, 1, m, k)] = 1.0f;
  }
  for (int64_t j = 0; j < n; ++j) {
    hb[at(key.trans_b, 0, j, k, n)] = 1.0f;
    hb[at(key.trans_b, 1, j, k, n)] = values[(j + 3) % 8];
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) hy[static_cast<size_t>(i * n + j)] = ys[(i * 7 + j * 3) % 5];
  }
  if (!same_bits(ha, hb, hy)) return false;
  // Round 2: finite pseudo-random operands (a 64-bit LCG), either sign, magnitudes 2^-20 ..
  // 2^20; y with a fifth of its elements zero and a fifth negative.
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 32);
  };
  auto number = [&next] {
    const uint32_t r = next();
    const float mantissa = 1.0f + static_cast<float>(r & 0xffffu) / 65536.0f;
    const int exponent = static_cast<int>((r >> 16) % 41) - 20;
    return ((r >> 31) != 0 ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
  };
  for (float& v : ha) v = number();
  for (float& v : hb) v = number();
  for (float& v : hy) {
    const uint32_t r = next() % 5;
    v = r == 0 ? 0.0f : r == 1 ? -1.0f : 1.0f + static_cast<float>(r);
  }
  return same_bits(ha, hb, hy);
}

}  // namespace

struct LtPlans {
  std::map<LtKey, LtPlan> plans;
};

namespace {

// The plan (and its key) of the product of (m, n, k) with these transposes, precision and operand
// addresses on logical device l, made on first use. The caller holds l.blas_mu.
std::pair<const LtKey, LtPlan>& plan_of(Logical& l, int device, int64_t m, int64_t n, int64_t k,
                                        const void* a, bool trans_a, const void* b, bool trans_b,
                                        const void* c, Precision precision) {
  if (l.lt == nullptr) {
    MESHRT_CUBLAS_CHECK(cublasLtCreate(&l.lt), device);
    l.lt_plans = std::make_shared<LtPlans>();
  }
  const bool tf32 = precision == Precision::tf32;
  const LtKey key{m, n, k, trans_a, trans_b, tf32, alignment(a), alignment(b), alignment(c)};
  auto it = l.lt_plans->plans.find(key);
  if (it == l.lt_plans->plans.end())
    it = l.lt_plans->plans.emplace(key, make_plan(l.lt, key, device)).first;
  return *it;
}

}  // namespace

bool CudaBackend::lt_gemm(int device, int64_t m, int64_t n, int64_t k, const void* a, bool trans_a,
                          const void* b, bool trans_b, void* c, Precision precision,
                          const void* bias, int epilogue) {
  if (epilogue > 0 && (bias == nullptr || alignment(bias) < 16)) return false;
  Logical& l = dev(device);
  set(device);
  std::lock_guard<std::mutex> lock(l.blas_mu);
  auto& [key, p] = plan_of(l, device, m, n, k, a, trans_a, b, trans_b, c, precision);
  if (!p.ok || (epilogue > 0 && !p.epilogues)) return false;
  if (p.workspace > 0 && l.lt_workspace == nullptr)
    l.lt_workspace = allocate(device, kLtWorkspaceBytes);
  void* workspace = p.workspace > 0 ? l.lt_workspace->data() : nullptr;
  int e = epilogue;
  if (e == 2) {
    // The probe waits on the host: never inside a CUDA graph capture (graphs.cpp), where relu
    // runs as its own kernel until a call outside one has probed.
    if (p.relu == LtPlan::Relu::unknown && t_capture == nullptr) {
      p.relu = relu_keeps_nan(*this, l, device, key, p, workspace) ? LtPlan::Relu::fused
                                                                   : LtPlan::Relu::separate;
    }
    if (p.relu != LtPlan::Relu::fused) e = 1;  // BIAS, then relu's own kernel below
  }
  if (e > 0) set_desc(p.desc[e], CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, device);
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st =
      cublasLtMatmul(l.lt, p.desc[e], &one, b, p.la, a, p.lb, &zero, c, p.lc, c, p.lc, &p.algo,
                     workspace, p.workspace, ops_stream(device));
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    // An algorithm the check accepted may still refuse to run (cublasLt.h says so): from now on
    // the shape's layers, or the whole shape, take the unfused calls / the classic GEMM.
    (e == 0 ? p.ok : p.epilogues) = false;
    return false;
  }
  if (st != CUBLAS_STATUS_SUCCESS) throw_cublas(st, "cublasLtMatmul", device);
  if (epilogue == 2 && e == 1) {
    unary(device, backend::UnaryOp::relu, DType::f32, DType::f32, {m, n},
          backend::Strided{c, {n, 1}}, c);
  }
  if (epilogue > 0) fused_matmul_bias_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool CudaBackend::lt_drelu(int device, int64_t m, int64_t n, int64_t k, const void* a, bool trans_a,
                           const void* b, bool trans_b, Precision precision, const void* relu_out,
                           void* y) {
  Logical& l = dev(device);
  set(device);
  std::lock_guard<std::mutex> lock(l.blas_mu);
  auto& [key, p] = plan_of(l, device, m, n, k, a, trans_a, b, trans_b, y, precision);
  if (l.zero_f32 == nullptr && t_capture == nullptr) {  // the unfused calls' zero (matmul_drelu)
    l.zero_f32 = allocate(device, sizeof(float));
    MESHRT_CUDA_CHECK(cudaMemsetAsync(l.zero_f32->data(), 0, sizeof(float), ops_stream(device)),
                      device);
  }
  if (!p.ok) return false;
  if (p.drelu == LtPlan::Drelu::unknown) {
    // The probe allocates and waits on the host: never inside a CUDA graph capture (graphs.cpp),
    // where the unfused calls run until a call outside one has probed.
    if (t_capture != nullptr) return false;
    if (l.lt_workspace == nullptr) l.lt_workspace = allocate(device, kLtWorkspaceBytes);
    const bool ok = make_drelu_desc(l.lt, key, p, device) &&
                    drelu_matches(*this, l, device, key, p, l.lt_workspace->data());
    p.drelu = ok ? LtPlan::Drelu::fused : LtPlan::Drelu::separate;
  }
  if (p.drelu != LtPlan::Drelu::fused) return false;
  void* workspace = l.lt_workspace->data();
  const cudaStream_t s = ops_stream(device);
  MESHRT_CUDA_CHECK(launch_relu_mask(s, m, n, mask_ld(n), static_cast<const float*>(relu_out),
                                     static_cast<uint32_t*>(p.mask->data())),
                    device);
  set_desc(p.drelu_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.mask->data(), device);
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(l.lt, p.drelu_desc, &one, b, p.la, a, p.lb, &zero, y,
                                           p.lc, y, p.lc, &p.algo, workspace, p.drelu_workspace, s);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    // As lt_gemm: from now on this shape's relu gradients run unfused (the mask made is unread).
    p.drelu = LtPlan::Drelu::separate;
    return false;
  }
  if (st != CUBLAS_STATUS_SUCCESS) throw_cublas(st, "cublasLtMatmul", device);
  fused_matmul_drelu_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void CudaBackend::matmul_drelu(int device, DType dtype, int64_t m, int64_t n, int64_t k,
                               const void* a, bool trans_a, const void* b, bool trans_b,
                               Precision precision, const void* relu_out, void* y) {
  if (lt_ && dtype == DType::f32 && m > 0 && n > 0 && k > 0 &&
      lt_drelu(device, m, n, k, a, trans_a, b, trans_b, precision, relu_out, y)) {
    return;
  }
  // The unfused calls: the product (through this shape's plan, as eager), then relu's gradient,
  // its zero the scalar lt_drelu made (no allocation per call, so the step stays capturable as a
  // CUDA graph); without one, the backend's default.
  std::shared_ptr<backend::Buffer> zero;
  if (dtype == DType::f32) {
    Logical& l = dev(device);
    std::lock_guard<std::mutex> lock(l.blas_mu);
    zero = l.zero_f32;
  }
  if (zero == nullptr) {
    Backend::matmul_drelu(device, dtype, m, n, k, a, trans_a, b, trans_b, precision, relu_out, y);
  } else {
    matmul_drelu_unfused(device, dtype, m, n, k, a, trans_a, b, trans_b, precision, relu_out,
                         zero->data(), y);
  }
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
