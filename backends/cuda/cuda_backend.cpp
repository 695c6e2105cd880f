// The cuda backend's logical devices, peer access, memory and copies (cuda_backend.h).
#include "backends/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/copy_kernels.h"
#include "backends/cuda/cuda_check.h"
#include "backends/pitched_copy.h"
#include "backends/plugin.h"
#include "core/config.h"
#include "core/error.h"

namespace meshrt::cuda {
namespace {

constexpr size_t kStagingBytes = size_t{8} << 20;    // per half of a logical device's pinned buffer
constexpr size_t kStageAtLeast = size_t{256} << 10;  // smaller host copies go straight through

// Restores the calling thread's current GPU: blocks may be freed on any thread.
class CurrentGpu {
 public:
  CurrentGpu() {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
  }
  ~CurrentGpu() {
    if (saved_ >= 0) (void)cudaSetDevice(saved_);
  }
  CurrentGpu(const CurrentGpu&) = delete;
  CurrentGpu& operator=(const CurrentGpu&) = delete;

 private:
  int saved_ = -1;
};

std::string cuda_error(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

}  // namespace

std::string dev_name(int d) { return "cuda:" + std::to_string(d); }

CudaBackend::CudaBackend() : Backend(/*host_memory=*/false) {
  int gpus = 0;
  cudaError_t err = cudaGetDeviceCount(&gpus);
  if (err != cudaSuccess) {
    // No driver or no GPU: the platform is built but not usable on this machine.
    reason_ = "no usable GPU: cudaGetDeviceCount returned " + cuda_error(err);
    (void)cudaGetLastError();
    return;
  }
  if (gpus == 0) {
    reason_ = "no GPU found (cudaGetDeviceCount = 0)";
    return;
  }
  per_gpu_ = config::cuda_devices_per_gpu();
  fence_timeout_ = config::collective_timeout();
  sync_copies_ = config::cuda_sync_copies();
  lt_ = config::cuda_matmul_lt();
  graphs_ = config::cuda_graphs();
  chains_ = config::cuda_fusion_chains();
  const bool fibers = config::cuda_fibers();
  if (fibers && gpus > 1) {
    reason_ =
        "MESHRT_CUDA_EXECUTOR=fibers runs the logical devices of one GPU as fibers on one "
        "thread, and this machine shows " +
        std::to_string(gpus) +
        " GPUs (NCCL's ranks on several GPUs need a thread each): unset it to use a thread "
        "per logical device, or show one GPU (CUDA_VISIBLE_DEVICES=0)";
    return;
  }
  gpus_ = gpus;
  max_pitch_ = SIZE_MAX;
  for (int g = 0; g < gpus; ++g) {
    int pitch = 0;
    MESHRT_CUDA_CHECK(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, g), g * per_gpu_);
    max_pitch_ = std::min(max_pitch_, static_cast<size_t>(pitch));
  }
  init_peer_access();
  for (int g = 0; g < gpus; ++g) {
    size_t free_b = 0, total_b = 0;
    MESHRT_CUDA_CHECK(cudaSetDevice(g), g * per_gpu_);
    MESHRT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), g * per_gpu_);
    // Cache up to a quarter of the GPU's share per logical device (MESHRT_CUDA_CACHE_BYTES
    // overrides).
    size_t limit = total_b / 4 / static_cast<size_t>(per_gpu_);
    if (auto bytes = config::cuda_cache_bytes()) limit = *bytes;
    for (int k = 0; k < per_gpu_; ++k) {
      const int id = g * per_gpu_ + k;
      auto l = std::make_unique<Logical>();
      l->gpu = g;
      MESHRT_CUDA_CHECK(cudaStreamCreateWithFlags(&l->compute, cudaStreamNonBlocking), id);
      MESHRT_CUDA_CHECK(cudaStreamCreateWithFlags(&l->comm, cudaStreamNonBlocking), id);
      MESHRT_CUDA_CHECK(cudaEventCreateWithFlags(&l->staged[0], cudaEventDisableTiming), id);
      MESHRT_CUDA_CHECK(cudaEventCreateWithFlags(&l->staged[1], cudaEventDisableTiming), id);
      l->cache = std::make_unique<backend::BlockCache>(
          limit, [this, id](void* p) { release_block(id, p); });
      if (!fibers) l->exec = std::make_unique<core::Executor>([g] { cudaSetDevice(g); });
      devs_.push_back(std::move(l));
    }
  }
  // Every CUDA call sets its device first (set()), so a fiber may run on any thread.
  if (fibers) fibers_ = std::make_unique<core::FiberPool>(static_cast<int>(devs_.size()), 1);
  nccl_ = make_nccl_comm(*this);
}

// Every pair of GPUs that can reach each other's memory gets peer access; what fails is kept,
// with the reason, so a group that needs it gets a clear error (direct_unavailable) instead of a
// kernel faulting on a peer's pointer.
void CudaBackend::init_peer_access() {
  no_peer_.assign(static_cast<size_t>(gpus_) * static_cast<size_t>(gpus_), "");
  for (int a = 0; a < gpus_; ++a) {
    for (int b = 0; b < gpus_; ++b) {
      if (a == b) continue;
      std::string& why =
          no_peer_[static_cast<size_t>(a) * static_cast<size_t>(gpus_) + static_cast<size_t>(b)];
      int can = 0;
      cudaError_t err = cudaDeviceCanAccessPeer(&can, a, b);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        why = "cudaDeviceCanAccessPeer(GPU " + std::to_string(a) + ", GPU " + std::to_string(b) +
              ") failed: " + cuda_error(err);
        continue;
      }
      if (!can) {
        why = "GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) +
              "'s memory (cudaDeviceCanAccessPeer = 0: no NVLink or PCIe peer path)";
        continue;
      }
      MESHRT_CUDA_CHECK(cudaSetDevice(a), a * per_gpu_);
      err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else if (err != cudaSuccess) {
        (void)cudaGetLastError();
        why = "cudaDeviceEnablePeerAccess(GPU " + std::to_string(a) + " -> GPU " +
              std::to_string(b) + ") failed: " + cuda_error(err);
      }
    }
  }
}

std::string CudaBackend::direct_unavailable(const std::vector<int>& group) {
  for (size_t i = 0; i < group.size(); ++i) {
    for (size_t j = i + 1; j < group.size(); ++j) {
      const int a = dev(group[i]).gpu, b = dev(group[j]).gpu;
      if (a == b) continue;
      for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
        const std::string& why =
            no_peer_[static_cast<size_t>(x) * static_cast<size_t>(gpus_) + static_cast<size_t>(y)];
        if (!why.empty()) {
          return dev_name(group[i]) + " and " + dev_name(group[j]) +
                 " are on GPUs without peer access: " + why +
                 "; algo native (NCCL) serves groups of distinct GPUs without it";
        }
      }
    }
  }
  return "";
}

void CudaBackend::set(int device) { MESHRT_CUDA_CHECK(cudaSetDevice(dev(device).gpu), device); }

void CudaBackend::sync(int device, cudaStream_t s) {
  set(device);
  MESHRT_CUDA_CHECK(cudaStreamSynchronize(s), device);
}

void CudaBackend::synchronize(int device) {
  Logical& l = dev(device);
  set(device);
  for (cudaStream_t s : {l.compute, l.comm}) {
    const cudaError_t err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) {
      throw Error("[cuda] work queued on " + dev_name(device) +
                  " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                  "); a kernel or copy queued earlier failed and this wait is where it surfaces. "
                  "Run with CUDA_LAUNCH_BLOCKING=1 to see the call that queued it");
    }
  }
}

cudaError_t CudaBackend::copy_async(void* dst, size_t dpitch, const void* src, size_t spitch,
                                    size_t width, size_t height, cudaStream_t s) const {
  return backend::pitched_copy<cudaError_t>(
      dst, dpitch, src, spitch, width, height, max_pitch_,
      [s](void* d, const void* from, size_t bytes) {
        return cudaMemcpyAsync(d, from, bytes, cudaMemcpyDefault, s);
      },
      [s](void* d, size_t dp, const void* from, size_t sp, size_t w, size_t h) {
        return cudaMemcpy2DAsync(d, dp, from, sp, w, h, cudaMemcpyDefault, s);
      });
}

// ---- memory

std::shared_ptr<backend::Buffer> CudaBackend::allocate(int device, size_t bytes) {
  // Inside a graph capture the block would be baked into the graph and reused by others after
  // this call: the capture is dropped (run_graph then runs its work as usual).
  if (t_capture != nullptr) t_capture->ok = false;
  Logical& l = dev(device);
  const size_t cls = backend::BlockCache::size_class(bytes == 0 ? 1 : bytes);
  void* p = l.cache->take(cls);
  if (p == nullptr) {
    set(device);
    // cudaMalloc is not allowed on a thread capturing in thread-local mode (it would fail and
    // invalidate the capture): relaxed for this call; the capture is dropped above anyway.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (t_capture != nullptr) (void)cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = cudaMalloc(&p, cls);
    if (t_capture != nullptr) (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      for (auto& other : devs_) {  // give back what every logical device on this GPU keeps cached
        if (other->gpu == l.gpu) other->cache->trim();
      }
      set(device);
      err = cudaMalloc(&p, cls);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error("[cuda] out of memory allocating " + std::to_string(bytes) + " bytes on " +
                  dev_name(device) + " (GPU " + std::to_string(l.gpu) +
                  "): this logical device holds " + std::to_string(l.in_use.load()) +
                  " bytes in arrays; the GPU has " + std::to_string(free_b) + " of " +
                  std::to_string(total_b) + " bytes free (" + cudaGetErrorName(err) +
                  "). Use smaller arrays, fewer logical devices per GPU "
                  "(MESHRT_CUDA_DEVICES_PER_GPU), or drop arrays you no longer need");
    }
  }
  l.in_use.fetch_add(static_cast<int64_t>(cls), std::memory_order_relaxed);
  return std::make_shared<backend::Buffer>(this, device, p, bytes);
}

void CudaBackend::deallocate(int device, void* data, size_t bytes) noexcept {
  Logical& l = dev(device);
  const size_t cls = backend::BlockCache::size_class(bytes == 0 ? 1 : bytes);
  l.in_use.fetch_sub(static_cast<int64_t>(cls), std::memory_order_relaxed);
  // Kernels still queued on the compute stream may use the block; it is handed out again only to
  // this logical device, whose later work is ordered after them.
  if (l.cache->give(data, cls)) return;
  if (t_capture != nullptr) {  // no host wait or cudaFree while capturing a graph (graphs.cpp)
    t_capture->ok = false;
    t_capture->to_release.emplace_back(device, data);
    return;
  }
  release_block(device, data);
}

// Returns a block to the driver, never under a cache lock (BlockCache calls it outside): the
// device's own streams are drained first, so no kernel of ours still uses the block when cudaFree
// (which synchronises the whole GPU) runs. Errors cannot be reported from a deallocation; a
// sticky one surfaces at the device's next checked call.
void CudaBackend::release_block(int device, void* p) noexcept {
  Logical& l = dev(device);
  CurrentGpu keep;
  if (cudaSetDevice(l.gpu) != cudaSuccess || cudaStreamSynchronize(l.compute) != cudaSuccess ||
      cudaStreamSynchronize(l.comm) != cudaSuccess || cudaFree(p) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

// ---- copies

void CudaBackend::copy_2d(void* dst, int dst_device, size_t dpitch, const void* src, int src_device,
                          size_t spitch, size_t width, size_t height) {
  if (width == 0 || height == 0) return;
  const bool from_host = src_device == backend::kHost, to_host = dst_device == backend::kHost;
  if (from_host && to_host) {
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                  width);
    }
    return;
  }
  const bool flat = (dpitch == width && spitch == width) || height == 1;
  if ((from_host || to_host) && flat && width * height >= kStageAtLeast) {
    staged_copy(dst, dst_device, src, src_device, width * height);
    return;
  }
  if (!from_host && !to_host) {
    device_copy(dst, dst_device, dpitch, src, src_device, spitch, width, height);
    return;
  }
  // With the host: on the device's compute stream, after the work that produced (or last used)
  // the device side, and waited for, since the host side is the caller's memory.
  const int actor = to_host ? src_device : dst_device;
  Logical& l = dev(actor);
  set(actor);
  MESHRT_CUDA_CHECK(copy_async(dst, dpitch, src, spitch, width, height, l.compute), actor);
  sync(actor, l.compute);
}

// Device to device, stream-ordered, no host wait: the copy is queued on the destination's compute
// stream after everything queued so far on the source's (the producer), and the source's compute
// stream waits for the copy before its later work (which may reuse or overwrite the source's
// memory). Later users of the destination are on its compute stream, on a peer's stream after an
// event of it (another copy), after coll_begin's wait (a collective), or after a host wait
// (copies to the host, synchronize): each is ordered after the copy.
void CudaBackend::device_copy(void* dst, int dst_device, size_t dpitch, const void* src,
                              int src_device, size_t spitch, size_t width, size_t height) {
  Logical& d = dev(dst_device);
  const bool same = src_device == dst_device;
  if (sync_copies_) {  // MESHRT_CUDA_SYNC_COPIES=1: the host waits before and after
    if (!same) sync(src_device, dev(src_device).compute);
    set(dst_device);
    MESHRT_CUDA_CHECK(copy_async(dst, dpitch, src, spitch, width, height, d.compute), dst_device);
    sync(dst_device, d.compute);
    return;
  }
  if (!same) order_after(dst_device, src_device);
  set(dst_device);
  // Within one device: its op stream (a graph capture's, while one runs on this thread).
  MESHRT_CUDA_CHECK(copy_async(dst, dpitch, src, spitch, width, height,
                               same ? ops_stream(dst_device) : d.compute),
                    dst_device);
  if (!same) order_after(src_device, dst_device);
}

void CudaBackend::copy_2d_batch(const std::vector<backend::DeviceCopy>& copies) {
  if (sync_copies_) {
    Backend::copy_2d_batch(copies);
    return;
  }
  std::vector<std::vector<CopyDesc>> per_gpu(static_cast<size_t>(gpus_));
  std::vector<std::vector<int>> involved(static_cast<size_t>(gpus_));
  std::vector<int> hub(static_cast<size_t>(gpus_), -1);
  for (const backend::DeviceCopy& c : copies) {
    if (c.width == 0 || c.height == 0) continue;
    const int g = dev(c.dst_device).gpu;
    if (dev(c.src_device).gpu != g) {  // between GPUs: the peer copy, ordered one by one
      device_copy(c.dst, c.dst_device, c.dpitch, c.src, c.src_device, c.spitch, c.width, c.height);
      continue;
    }
    auto& list = per_gpu[static_cast<size_t>(g)];
    list.push_back(CopyDesc{static_cast<char*>(c.dst), static_cast<const char*>(c.src),
                            static_cast<int64_t>(c.dpitch), static_cast<int64_t>(c.spitch),
                            static_cast<int64_t>(c.width), static_cast<int64_t>(c.height)});
    if (hub[static_cast<size_t>(g)] < 0) hub[static_cast<size_t>(g)] = c.dst_device;
    auto& inv = involved[static_cast<size_t>(g)];
    for (int d : {c.src_device, c.dst_device}) {
      if (std::find(inv.begin(), inv.end(), d) == inv.end()) inv.push_back(d);
    }
  }
  for (size_t g = 0; g < per_gpu.size(); ++g) {
    if (per_gpu[g].empty()) continue;
    // The batch runs after every involved device's queued work (the producers of the sources,
    // and the last users of the destinations' memory), on the hub's compute stream.
    const int h = hub[g];
    for (int d : involved[g]) {
      if (d != h) order_after(h, d);
    }
    Logical& l = dev(h);
    set(h);
    MESHRT_CUDA_CHECK(
        launch_copy_batch(l.compute, per_gpu[g].data(), static_cast<int>(per_gpu[g].size())), h);
    // Every involved device's later work (reading a destination, overwriting a source) waits.
    std::lock_guard<std::mutex> lock(l.order_mu);
    if (l.order == nullptr)
      MESHRT_CUDA_CHECK(cudaEventCreateWithFlags(&l.order, cudaEventDisableTiming), h);
    MESHRT_CUDA_CHECK(cudaEventRecord(l.order, l.compute), h);
    for (int d : involved[g]) {
      if (d == h) continue;
      set(d);
      MESHRT_CUDA_CHECK(cudaStreamWaitEvent(dev(d).compute, l.order, 0), d);
    }
  }
}

// `waiter`'s compute stream waits for everything queued so far on `producer`'s. The event is
// re-recorded at once by the next caller: cudaStreamWaitEvent takes the record in effect when it
// is called.
void CudaBackend::order_after(int waiter, int producer) {
  Logical& p = dev(producer);
  std::lock_guard<std::mutex> lock(p.order_mu);
  set(producer);
  if (p.order == nullptr)
    MESHRT_CUDA_CHECK(cudaEventCreateWithFlags(&p.order, cudaEventDisableTiming), producer);
  MESHRT_CUDA_CHECK(cudaEventRecord(p.order, p.compute), producer);
  set(waiter);
  MESHRT_CUDA_CHECK(cudaStreamWaitEvent(dev(waiter).compute, p.order, 0), waiter);
}

// Host <-> device through the logical device's pinned buffer, double-buffered: the host-side
// memcpy of one half overlaps the DMA of the other.
void CudaBackend::staged_copy(void* dst, int dst_device, const void* src, int src_device,
                              size_t bytes) {
  const bool upload = src_device == backend::kHost;
  const int device = upload ? dst_device : src_device;
  Logical& l = dev(device);
  std::lock_guard<std::mutex> lock(l.stage_mu);
  set(device);
  if (l.staging == nullptr) {
    MESHRT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&l.staging), 2 * kStagingBytes,
                                    cudaHostAllocPortable),
                      device);
  }
  cudaStream_t s = l.compute;  // after the kernels that produced (or last used) the device side
  auto* d = static_cast<char*>(dst);
  const auto* h = static_cast<const char*>(src);
  size_t pending_off = 0, pending_len = 0;
  int pending_half = -1;
  int half = 0;
  for (size_t off = 0; off < bytes; off += kStagingBytes, half ^= 1) {
    const size_t n = std::min(kStagingBytes, bytes - off);
    char* stage = l.staging + static_cast<size_t>(half) * kStagingBytes;
    MESHRT_CUDA_CHECK(cudaEventSynchronize(l.staged[half]), device);  // its last DMA is done
    if (upload) {
      std::memcpy(stage, h + off, n);
      MESHRT_CUDA_CHECK(cudaMemcpyAsync(d + off, stage, n, cudaMemcpyHostToDevice, s), device);
      MESHRT_CUDA_CHECK(cudaEventRecord(l.staged[half], s), device);
    } else {
      MESHRT_CUDA_CHECK(cudaMemcpyAsync(stage, h + off, n, cudaMemcpyDeviceToHost, s), device);
      MESHRT_CUDA_CHECK(cudaEventRecord(l.staged[half], s), device);
      if (pending_half >= 0) drain(l, device, pending_half, d + pending_off, pending_len);
      pending_half = half;
      pending_off = off;
      pending_len = n;
    }
  }
  if (pending_half >= 0) drain(l, device, pending_half, d + pending_off, pending_len);
  sync(device, s);
}

void CudaBackend::drain(Logical& l, int device, int half, char* to, size_t n) {
  MESHRT_CUDA_CHECK(cudaEventSynchronize(l.staged[half]), device);
  std::memcpy(to, l.staging + static_cast<size_t>(half) * kStagingBytes, n);
}

void CudaBackend::submit(int device, std::function<void()> task) {
  if (fibers_) {
    fibers_->submit(device, std::move(task));
  } else {
    dev(device).exec->submit(std::move(task));
  }
}

bool CudaBackend::drive(int device, const std::atomic<uint32_t>& done) {
  return fibers_ && fibers_->drive(device, done);
}

bool CudaBackend::claim(int device) { return fibers_ && fibers_->claim(device); }

}  // namespace meshrt::cuda

// The plugin's entry points (backends/plugin.h): the core calls these after dlopen.
extern "C" int meshrt_plugin_abi() { return meshrt::backend::kPluginAbi; }
extern "C" meshrt::backend::Backend* meshrt_cuda_backend() {
  return new meshrt::cuda::CudaBackend();
}
