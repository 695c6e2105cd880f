// backends/cuda/cuda_check.h: every CUDA runtime and cuBLAS/cuBLASLt call is checked; failures
// are meshrt::Errors naming the call, the device and the CUDA error or cuBLAS status.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace meshrt::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, int device) {
  throw Error(std::string("[cuda] ") + call + " failed on cuda:" + std::to_string(device) + ": " +
              cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

[[noreturn]] inline void throw_cublas(cublasStatus_t st, const char* call, int device) {
  throw Error(std::string("[cuda] ") + call + " failed on cuda:" + std::to_string(device) +
              ": cuBLAS status " + std::to_string(static_cast<int>(st)) + " (" +
              cublasGetStatusString(st) + ")");
}

}  // namespace meshrt::cuda

#define MESHRT_CUDA_CHECK(call, device)                               \
  do {                                                                \
    cudaError_t meshrt_err_ = (call);                                 \
    if (meshrt_err_ != cudaSuccess)                                   \
      ::meshrt::cuda::throw_cuda_error(meshrt_err_, #call, (device)); \
  } while (0)

#define MESHRT_CUBLAS_CHECK(call, device)                        \
  do {                                                           \
    cublasStatus_t meshrt_st_ = (call);                          \
    if (meshrt_st_ != CUBLAS_STATUS_SUCCESS)                     \
      ::meshrt::cuda::throw_cublas(meshrt_st_, #call, (device)); \
  } while (0)
