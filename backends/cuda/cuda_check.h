// backends/cuda/cuda_check.h: every CUDA runtime call is checked; failures are meshrt::Errors
// naming the call, the device and the CUDA error.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace meshrt::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, int device) {
  throw Error(std::string("[cuda] ") + call + " failed on cuda:" + std::to_string(device) + ": " +
              cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace meshrt::cuda

#define MESHRT_CUDA_CHECK(call, device)                               \
  do {                                                                \
    cudaError_t meshrt_err_ = (call);                                 \
    if (meshrt_err_ != cudaSuccess)                                   \
      ::meshrt::cuda::throw_cuda_error(meshrt_err_, #call, (device)); \
  } while (0)
