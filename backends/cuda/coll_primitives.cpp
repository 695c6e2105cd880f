// The cuda backend's collective primitives: copies, fold kernels and progress events on the
// logical device's communication stream, fenced by polling (cuda_backend.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/error.h"

namespace meshrt::cuda {

using backend::FoldOp;

void CudaBackend::coll_begin(int device) { sync(device, dev(device).compute); }

void CudaBackend::coll_copy_2d(int device, void* dst, size_t dpitch, const void* src, size_t spitch,
                               size_t width, size_t height) {
  set(device);
  MESHRT_CUDA_CHECK(copy_async(dst, dpitch, src, spitch, width, height, dev(device).comm), device);
}

void CudaBackend::coll_zero(int device, void* dst, size_t bytes) {
  set(device);
  MESHRT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, dev(device).comm), device);
}

void CudaBackend::coll_fold(int device, FoldOp op, DType in, DType out, void* dst,
                            const std::vector<const void*>& srcs, int64_t len) {
  Logical& l = dev(device);
  set(device);
  if (is_half(in) && op == FoldOp::mean) {
    // 16-bit pmean: summed in float32 over every source, divided, rounded once (the cpu's bits).
    if (in != out)
      throw Error("[collectives] a 16-bit pmean keeps its dtype; this is a meshrt bug");
    if (!srcs.empty() && srcs.size() <= kMaxFoldTo) {
      void* const one[1] = {dst};
      MESHRT_CUDA_CHECK(launch_fold_to(l.comm, static_cast<int>(op), in, one, 1, srcs.data(),
                                       static_cast<int>(srcs.size()), len),
                        device);
    } else {
      fold_chain(device, static_cast<int>(op), in, dst, len, srcs, len, len, 1);
    }
    return;
  }
  if (op != FoldOp::mean && in == out && !srcs.empty() && srcs.size() <= kMaxFoldTo) {
    // The vectorised one-output fold (the ring's steps, direct's own blocks): same order, same
    // bits.
    void* const one[1] = {dst};
    MESHRT_CUDA_CHECK(launch_fold_to(l.comm, static_cast<int>(op), in, one, 1, srcs.data(),
                                     static_cast<int>(srcs.size()), len),
                      device);
    return;
  }
  if (op != FoldOp::mean) {
    fold_chain(device, static_cast<int>(op), in, dst, len, srcs, len, len, 1);
    return;
  }
  // pmean: sum in the input dtype (integers wrap, as psum), then divide in the output dtype.
  void* sum = dst;
  if (in != out) {
    const size_t bytes = static_cast<size_t>(len) * dtype_size(in);
    auto buf = allocate(device, bytes);
    sum = buf->data();
    l.hold.push_back(std::move(buf));  // until the fence: the stream still reads it
  }
  if (srcs.size() <= kMaxFoldTo) {
    void* const one[1] = {sum};
    MESHRT_CUDA_CHECK(launch_fold_to(l.comm, static_cast<int>(FoldOp::sum), in, one, 1, srcs.data(),
                                     static_cast<int>(srcs.size()), len),
                      device);
  } else {
    fold_chain(device, static_cast<int>(FoldOp::sum), in, sum, len, srcs, len, len, 1);
  }
  MESHRT_CUDA_CHECK(launch_mean(l.comm, in, out, dst, sum, len, static_cast<int64_t>(srcs.size())),
                    device);
}

void CudaBackend::coll_fold_to(int device, FoldOp op, DType in, DType out,
                               const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                               int64_t len) {
  // A 16-bit mean folds here too (launch_fold_to divides before its one rounding).
  if ((op == FoldOp::mean && !is_half(in)) || in != out || srcs.empty() ||
      srcs.size() > kMaxFoldTo || dsts.size() > kMaxFoldTo) {
    Backend::coll_fold_to(device, op, in, out, dsts, srcs, len);
    return;
  }
  set(device);
  MESHRT_CUDA_CHECK(launch_fold_to(dev(device).comm, static_cast<int>(op), in, dsts.data(),
                                   static_cast<int>(dsts.size()), srcs.data(),
                                   static_cast<int>(srcs.size()), len),
                    device);
}

void CudaBackend::coll_fold_rows(int device, FoldOp op, DType dtype, void* dst, int64_t dpitch,
                                 const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                                 int64_t rows) {
  if (op == FoldOp::mean)
    throw Error("[collectives] coll_fold_rows takes sum, max or min; this is a meshrt bug");
  set(device);
  fold_chain(device, static_cast<int>(op), dtype, dst, dpitch, srcs, spitch, len, rows);
}

void CudaBackend::coll_mean(int device, DType in, DType out, void* dst, const void* sum,
                            int64_t len, int64_t divisor) {
  set(device);
  MESHRT_CUDA_CHECK(launch_mean(dev(device).comm, in, out, dst, sum, len, divisor), device);
}

// Polls the communication stream rather than blocking in cudaStreamSynchronize, so a GPU that
// never finishes (a peer's kernel that never comes) ends in an error after
// MESHRT_COLLECTIVE_TIMEOUT instead of a hang.
void CudaBackend::coll_fence(int device) {
  Logical& l = dev(device);
  set(device);
  const auto start = std::chrono::steady_clock::now();
  // The first 2 ms poll with a yield between queries: a sleep, even of 20 us, lasts about 70 us
  // with Linux's default timer slack, longer than most collectives between logical devices take.
  // After that, 100 us sleeps.
  constexpr auto kSpin = std::chrono::milliseconds(2);
  for (int polls = 0;; ++polls) {
    const cudaError_t st = cudaStreamQuery(l.comm);
    if (st == cudaSuccess) break;
    if (st != cudaErrorNotReady) MESHRT_CUDA_CHECK(st, device);
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited < kSpin)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (waited > fence_timeout_) {
      throw Error(
          "[cuda] collective work queued on " + dev_name(device) + " did not finish within " +
          std::to_string(fence_timeout_.count()) +
          " s (MESHRT_COLLECTIVE_TIMEOUT): a kernel is stuck on the GPU; the device is unusable "
          "until the process restarts");
    }
  }
  l.hold.clear();
  l.fences.fetch_add(1, std::memory_order_release);
}

void* CudaBackend::coll_signal(int device) { return record_token(device, dev(device).comm); }

void* CudaBackend::coll_begin_token(int device) {
  return record_token(device, dev(device).compute);
}

cudaEvent_t CudaBackend::record_token(int device, cudaStream_t s) {
  Logical& l = dev(device);
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(l.events_mu);
    if (!l.spare_events.empty()) {
      ev = l.spare_events.back();
      l.spare_events.pop_back();
    }
  }
  set(device);
  if (ev == nullptr)
    MESHRT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), device);
  MESHRT_CUDA_CHECK(cudaEventRecord(ev, s), device);
  return ev;
}

void CudaBackend::coll_wait_token(int device, void* token) {
  if (token == nullptr)
    throw Error("[collectives] a peer's progress token is missing; this is a meshrt bug");
  set(device);
  MESHRT_CUDA_CHECK(cudaStreamWaitEvent(dev(device).comm, static_cast<cudaEvent_t>(token), 0),
                    device);
}

void CudaBackend::coll_order_compute(int device, void* token) {
  if (token == nullptr)
    throw Error("[collectives] a peer's completion token is missing; this is a meshrt bug");
  set(device);
  MESHRT_CUDA_CHECK(cudaStreamWaitEvent(dev(device).compute, static_cast<cudaEvent_t>(token), 0),
                    device);
}

void CudaBackend::coll_release_token(int device, void* token) noexcept {
  Logical& l = dev(device);
  std::lock_guard<std::mutex> lock(l.events_mu);
  l.spare_events.push_back(static_cast<cudaEvent_t>(token));
}

void CudaBackend::fold_chain(int device, int op, DType t, void* dst, int64_t dpitch,
                             const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                             int64_t rows) {
  MESHRT_CUDA_CHECK(launch_fold_rows(dev(device).comm, op, t, dst, dpitch, srcs.data(),
                                     static_cast<int64_t>(srcs.size()), spitch, len, rows),
                    device);
}

}  // namespace meshrt::cuda
