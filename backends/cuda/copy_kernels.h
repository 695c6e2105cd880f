// backends/cuda/copy_kernels.h: one launch that moves a batch of pitched copies within one GPU's
// memory (copy_kernels.cu), for CudaBackend::copy_2d_batch: a resharding between logical devices
// of one GPU is tens of small copies, and one cudaMemcpy2DAsync plus two stream waits each cost
// more host time than the bytes take to move.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace meshrt::cuda {

// One copy: `height` rows of `width` bytes; row r at src + r * spitch and dst + r * dpitch.
struct CopyDesc {
  char* dst = nullptr;
  const char* src = nullptr;
  int64_t dpitch = 0, spitch = 0, width = 0, height = 0;
};

// Copies per launch (the descriptors travel as the kernel's parameter, under 4 KiB).
inline constexpr int kMaxBatchCopies = 64;

// Queues copies[0..n) on `s` in launches of at most kMaxBatchCopies, each copy moved in the widest
// unit (16, 8, 4 or 1 bytes) its pointers, pitches and width allow; contiguous copies (pitch ==
// width) without index arithmetic. No copy's destination may overlap another's source or
// destination. Returns the first launch error.
cudaError_t launch_copy_batch(cudaStream_t s, const CopyDesc* copies, int n);

}  // namespace meshrt::cuda
