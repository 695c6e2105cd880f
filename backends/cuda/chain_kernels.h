// backends/cuda/chain_kernels.h: a chain of elementwise ops in one kernel (chain_kernels.cu), for
// jit's fused chains (Backend::elementwise_chain under MESHRT_CUDA_FUSION=chains). One generic
// interpreter kernel, not compiled per chain: the chain travels in the launch's parameters, every
// thread runs it over its elements with the intermediates in a per-thread register file (shared
// memory), and each op is its single-op kernel's element function (elementwise_ops.cuh), rounded
// on its own, so the chain gives the bits of its ops run one after the other.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_kernels.h"
#include "core/dtype.h"

namespace meshrt::cuda {

// The kernel's limits: inputs, ops, and register-file slots (values live at once: the inputs an
// op still reads and the intermediates not yet consumed). The host refuses a longer chain.
inline constexpr int kChainMaxInputs = 8;
inline constexpr int kChainMaxOps = 32;
inline constexpr int kChainSlots = 16;
inline constexpr int kChainMaxOutputs = 8;     // backend::ElementwiseChain::kMaxOutputs
inline constexpr uint8_t kChainNoSlot = 0xff;  // an input no op reads: not loaded

// One op: kind 0 unary (op: UnaryOp by code; copy with in != out is astype), 1 binary (op:
// BinaryOp by code; comparisons write bool), 2 select (src[0] the bool condition, in == out).
// Sources and result are register-file slots; in/out are DType values.
// 3 constant: `bits` (a value of dtype out, as fill stores it) into dst; reads nothing.
inline constexpr uint8_t kChainUnary = 0, kChainBinary = 1, kChainSelect = 2, kChainConstant = 3;
inline constexpr uint8_t kChainRecipDiv = 1;  // flags: float16 division through the reciprocal
struct ChainStep {
  uint64_t bits = 0;  // constant
  uint8_t kind = 0, op = 0, in = 0, out = 0;
  uint8_t src[3] = {0, 0, 0};
  uint8_t dst = 0;
  uint8_t flags = 0;
};

// An input over the merged dims: element at data + sum_k idx_k * stride[k] (elements; 0
// broadcasts), loaded as its dtype's bits into `slot`.
struct ChainInput {
  const void* data = nullptr;
  int64_t stride[kMaxRank] = {};
  uint8_t dtype = 0;
  uint8_t slot = kChainNoSlot;
};

// An output: dense over the merged dims, stored from `slot` as `dtype` after the last op (every
// input of the element read by then: an output may be an input's memory, element for element).
struct ChainOutput {
  void* data = nullptr;
  uint8_t dtype = 0;
  uint8_t slot = 0;
};

// A whole chain as one kernel parameter (about 1.5 KB, under CUDA's 4 KB parameter limit).
struct ChainLaunch {
  Dims dims;
  int inputs = 0;
  int ops = 0;
  int outputs = 0;
  ChainInput in[kChainMaxInputs];
  ChainStep step[kChainMaxOps];
  ChainOutput out[kChainMaxOutputs];
};
static_assert(sizeof(ChainLaunch) < 4096, "a kernel's parameters are at most 4 KB");

// The outputs (n elements each) = the chain over c.dims; rank <= 2 walks (rows, cols) without an
// index division per element, higher ranks take a mixed-radix offset per element. Queued on `s`;
// allocates nothing and never waits (graph capture takes it).
cudaError_t launch_chain(cudaStream_t s, const ChainLaunch& c, int64_t n);

}  // namespace meshrt::cuda
