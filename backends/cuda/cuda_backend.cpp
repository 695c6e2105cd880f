// The cuda platform: each visible GPU split into MESHRT_CUDA_DEVICES_PER_GPU = k logical devices
// (default 1). A logical device has its own host executor thread bound to its GPU, a compute
// stream (op kernels, cuBLAS), a communication stream (collective copies and reductions, NCCL),
// a caching allocator with its own accounting, and pinned staging for host copies.
//
// Ordering (see also collectives/plane.h):
//   * op kernels are queued on the compute stream and return at once;
//   * copy_2d (device_put, to_vector, resharding) is synchronous: it orders itself after the
//     compute streams of the devices involved;
//   * a device joining a collective first waits for its compute stream (its input is complete and
//     no earlier kernel still uses memory a peer may now write); the collective's own work runs on
//     the communication stream and is fenced (stream synchronised) before a peer or the host is
//     told it is done, so compute queued between an async collective's start and its wait overlaps
//     with the transfer.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "backends/block_cache.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/merge_dims.h"
#include "core/config.h"
#include "core/error.h"
#include "core/threads/executor.h"

namespace meshrt::cuda {
namespace {

using backend::FoldOp;

constexpr size_t kStagingBytes = size_t{8} << 20;    // per half of a logical device's pinned buffer
constexpr size_t kStageAtLeast = size_t{256} << 10;  // smaller host copies go straight through

std::string dev_name(int d) { return "cuda:" + std::to_string(d); }

[[noreturn]] void throw_cublas(cublasStatus_t st, const char* call, int device) {
  throw Error(std::string("[cuda] ") + call + " failed on " + dev_name(device) +
              ": cuBLAS status " + std::to_string(static_cast<int>(st)));
}
#define MESHRT_CUBLAS_CHECK(call, device)                                               \
  do {                                                                                  \
    cublasStatus_t meshrt_st_ = (call);                                                 \
    if (meshrt_st_ != CUBLAS_STATUS_SUCCESS) throw_cublas(meshrt_st_, #call, (device)); \
  } while (0)

[[noreturn]] void throw_nccl(ncclResult_t r, const char* call, int device, ncclComm_t comm) {
  std::string detail = ncclGetErrorString(r);
  if (const char* last = comm ? ncclGetLastError(comm) : nullptr;
      last != nullptr && *last != '\0') {
    detail += std::string(": ") + last;
  }
  throw Error(std::string("[nccl] ") + call + " failed on " + dev_name(device) + ": " + detail +
              " (NCCL_DEBUG=WARN prints NCCL's own log)");
}
#define MESHRT_NCCL_CHECK(call, device, comm)                                     \
  do {                                                                            \
    ncclResult_t meshrt_r_ = (call);                                              \
    if (meshrt_r_ != ncclSuccess) throw_nccl(meshrt_r_, #call, (device), (comm)); \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::bool_:
      return ncclUint8;
  }
  return ncclUint8;
}

// One logical device.
struct Logical {
  int gpu = 0;
  cudaStream_t compute = nullptr;
  cudaStream_t comm = nullptr;
  std::mutex blas_mu;  // a cuBLAS handle is not for two threads at once
  cublasHandle_t blas = nullptr;
  std::unique_ptr<backend::BlockCache> cache;
  std::atomic<int64_t> in_use{0};  // bytes handed out and not yet freed
  std::mutex stage_mu;
  char* staging = nullptr;  // 2 x kStagingBytes pinned
  cudaEvent_t staged[2] = {nullptr, nullptr};
  // Temporaries the communication stream may still read; released at the next fence. Touched
  // only by the device's own executor thread.
  std::vector<std::shared_ptr<backend::Buffer>> hold;
  std::mutex events_mu;
  std::vector<cudaEvent_t> spare_events;  // guarded by events_mu: recycled progress tokens
  std::unique_ptr<core::Executor> exec;
};

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

// One row, or rows that are contiguous on both sides, is a 1-D copy; else a 2-D one.
cudaError_t copy_async(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                       size_t height, cudaStream_t s) {
  if (height == 1 || (dpitch == width && spitch == width)) {
    return cudaMemcpyAsync(dst, src, width * height, cudaMemcpyDefault, s);
  }
  return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, s);
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

class CudaBackend final : public backend::Backend {
 public:
  CudaBackend() {
    int gpus = 0;
    cudaError_t err = cudaGetDeviceCount(&gpus);
    if (err != cudaSuccess) {
      // No driver or no GPU: the platform is built but not usable on this machine.
      reason_ = std::string("no usable GPU: cudaGetDeviceCount returned ") + cudaGetErrorName(err) +
                " (" + cudaGetErrorString(err) + ")";
      (void)cudaGetLastError();
      return;
    }
    if (gpus == 0) {
      reason_ = "no GPU found (cudaGetDeviceCount = 0)";
      return;
    }
    per_gpu_ = config::cuda_devices_per_gpu();
    fence_timeout_ = config::collective_timeout();
    gpus_ = gpus;
    enable_peer_access();
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
        l->cache = std::make_unique<backend::BlockCache>(limit, [g](void* p) {
          cudaSetDevice(g);
          cudaFree(p);
        });
        l->exec = std::make_unique<core::Executor>([g] { cudaSetDevice(g); });
        devs_.push_back(std::move(l));
      }
    }
  }
  ~CudaBackend() override {
    // Leaked with the registry at exit (executors may still run); nothing to release here that
    // the driver does not reclaim with the process.
  }

  std::string_view platform() const override { return "cuda"; }
  int device_count() const override { return static_cast<int>(devs_.size()); }
  std::string unavailable_reason() const override { return reason_; }
  bool host_addressable() const override { return false; }

  // ---- memory

  std::shared_ptr<backend::Buffer> allocate(int device, size_t bytes) override {
    Logical& l = dev(device);
    const size_t cls = backend::BlockCache::size_class(bytes == 0 ? 1 : bytes);
    void* p = l.cache->take(cls);
    if (p == nullptr) {
      set(device);
      cudaError_t err = cudaMalloc(&p, cls);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        for (auto& other : devs_) {  // give back what every logical device on this GPU keeps cached
          if (other->gpu == l.gpu) other->cache->trim();
        }
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
                    "(MESHRT_CUDA_DEVICES_PER_GPU), or "
                    "drop arrays you no longer need");
      }
    }
    l.in_use.fetch_add(static_cast<int64_t>(cls), std::memory_order_relaxed);
    return std::make_shared<backend::Buffer>(this, device, p, bytes);
  }
  void deallocate(int device, void* data, size_t bytes) noexcept override {
    Logical& l = dev(device);
    const size_t cls = backend::BlockCache::size_class(bytes == 0 ? 1 : bytes);
    l.in_use.fetch_sub(static_cast<int64_t>(cls), std::memory_order_relaxed);
    // Kernels still queued on the compute stream may use the block; it is handed out again only to
    // this logical device, whose later work is ordered after them.
    if (!l.cache->give(data, cls)) {
      cudaSetDevice(l.gpu);
      cudaFree(data);  // synchronises the device first
    }
  }

  void copy_2d(void* dst, int dst_device, size_t dpitch, const void* src, int src_device,
               size_t spitch, size_t width, size_t height) override {
    if (width == 0 || height == 0) return;
    const bool from_host = src_device == backend::kHost, to_host = dst_device == backend::kHost;
    if (from_host && to_host) {
      for (size_t r = 0; r < height; ++r) {
        std::memcpy(static_cast<char*>(dst) + r * dpitch,
                    static_cast<const char*>(src) + r * spitch, width);
      }
      return;
    }
    const bool flat = (dpitch == width && spitch == width) || height == 1;
    if ((from_host || to_host) && flat && width * height >= kStageAtLeast) {
      staged_copy(dst, dst_device, src, src_device, width * height);
      return;
    }
    // The copy runs on the compute stream of the device doing it, after the producer's work.
    const int actor = to_host ? src_device : dst_device;
    if (!from_host && !to_host && src_device != dst_device)
      sync(src_device, dev(src_device).compute);
    Logical& l = dev(actor);
    set(actor);
    MESHRT_CUDA_CHECK(copy_async(dst, dpitch, src, spitch, width, height, l.compute), actor);
    sync(actor, l.compute);
  }

  // ---- op kernels, queued on the compute stream

  void unary(int device, backend::UnaryOp op, DType in, DType out,
             const std::vector<int64_t>& shape, const backend::Strided& x, void* y) override {
    const Flat f = flatten(shape, {&x});
    set(device);
    MESHRT_CUDA_CHECK(launch_unary(dev(device).compute, static_cast<int>(op), in, out, f.dims,
                                   f.ops[0], y, numel(shape)),
                      device);
  }
  void binary(int device, backend::BinaryOp op, DType in, DType out,
              const std::vector<int64_t>& shape, const backend::Strided& a,
              const backend::Strided& b, void* y) override {
    const Flat f = flatten(shape, {&a, &b});
    set(device);
    MESHRT_CUDA_CHECK(launch_binary(dev(device).compute, static_cast<int>(op), in, out, f.dims,
                                    f.ops[0], f.ops[1], y, numel(shape)),
                      device);
  }
  void select(int device, DType dtype, const std::vector<int64_t>& shape,
              const backend::Strided& cond, const backend::Strided& a, const backend::Strided& b,
              void* y) override {
    const Flat f = flatten(shape, {&cond, &a, &b});
    set(device);
    MESHRT_CUDA_CHECK(launch_select(dev(device).compute, dtype, f.dims, f.ops[0], f.ops[1],
                                    f.ops[2], y, numel(shape)),
                      device);
  }
  void reduce(int device, backend::ReduceOp op, DType dtype, int64_t outer, int64_t len,
              int64_t inner, const void* x, void* y) override {
    set(device);
    MESHRT_CUDA_CHECK(
        launch_reduce(dev(device).compute, static_cast<int>(op), dtype, outer, len, inner, x, y),
        device);
  }
  void matmul(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
              const void* a, const void* b, void* c) override {
    if (batch == 0 || m == 0 || n == 0) return;
    Logical& l = dev(device);
    set(device);
    if (k == 0) {
      MESHRT_CUDA_CHECK(launch_fill(l.compute, dtype, batch * m * n, 0.0, false, c), device);
      return;
    }
    if (dtype != DType::f32 && dtype != DType::f64) {
      MESHRT_CUDA_CHECK(launch_int_matmul(l.compute, dtype, batch, m, n, k, a, b, c), device);
      return;
    }
    constexpr int64_t kIntMax = 2147483647;
    if (m > kIntMax || n > kIntMax || k > kIntMax || batch > kIntMax) {
      throw Error(
          "[cuda] matmul dimensions beyond 2^31-1 are not supported by cuBLAS's 32-bit interface");
    }
    std::lock_guard<std::mutex> lock(l.blas_mu);
    if (l.blas == nullptr) MESHRT_CUBLAS_CHECK(cublasCreate(&l.blas), device);
    MESHRT_CUBLAS_CHECK(cublasSetStream(l.blas, l.compute), device);
    // Row-major C = A B is column-major C^T = B^T A^T: pass B first.
    const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
    if (dtype == DType::f32) {
      const float one = 1.0f, zero = 0.0f;
      MESHRT_CUBLAS_CHECK(
          cublasSgemmStridedBatched(l.blas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one,
                                    static_cast<const float*>(b), N, k * n,
                                    static_cast<const float*>(a), K, m * k, &zero,
                                    static_cast<float*>(c), N, m * n, static_cast<int>(batch)),
          device);
    } else {
      const double one = 1.0, zero = 0.0;
      MESHRT_CUBLAS_CHECK(
          cublasDgemmStridedBatched(l.blas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one,
                                    static_cast<const double*>(b), N, k * n,
                                    static_cast<const double*>(a), K, m * k, &zero,
                                    static_cast<double*>(c), N, m * n, static_cast<int>(batch)),
          device);
    }
  }
  void fill(int device, DType dtype, int64_t n, double value, bool iota, void* y) override {
    set(device);
    MESHRT_CUDA_CHECK(launch_fill(dev(device).compute, dtype, n, value, iota, y), device);
  }

  void submit(int device, std::function<void()> task) override {
    dev(device).exec->submit(std::move(task));
  }

  // ---- collective primitives, on the communication stream

  void coll_begin(int device) override { sync(device, dev(device).compute); }
  void coll_copy_2d(int device, void* dst, size_t dpitch, const void* src, size_t spitch,
                    size_t width, size_t height) override {
    set(device);
    MESHRT_CUDA_CHECK(copy_async(dst, dpitch, src, spitch, width, height, dev(device).comm),
                      device);
  }
  void coll_zero(int device, void* dst, size_t bytes) override {
    set(device);
    MESHRT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, dev(device).comm), device);
  }
  void coll_fold(int device, FoldOp op, DType in, DType out, void* dst,
                 const std::vector<const void*>& srcs, int64_t len) override {
    Logical& l = dev(device);
    set(device);
    if (op != FoldOp::mean) {
      fold_chain(device, static_cast<int>(op), in, dst, srcs, len);
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
    fold_chain(device, 0, in, sum, srcs, len);
    MESHRT_CUDA_CHECK(
        launch_mean(l.comm, in, out, dst, sum, len, static_cast<int64_t>(srcs.size())), device);
  }
  void coll_fold_rows(int device, FoldOp op, DType dtype, void* dst, int64_t dpitch,
                      const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                      int64_t rows) override {
    if (op == FoldOp::mean)
      throw Error("[collectives] coll_fold_rows takes sum, max or min; this is a meshrt bug");
    set(device);
    fold_chain(device, static_cast<int>(op), dtype, dst, dpitch, srcs, spitch, len, rows);
  }
  void coll_mean(int device, DType in, DType out, void* dst, const void* sum, int64_t len,
                 int64_t divisor) override {
    set(device);
    MESHRT_CUDA_CHECK(launch_mean(dev(device).comm, in, out, dst, sum, len, divisor), device);
  }
  // Polls the communication stream rather than blocking in cudaStreamSynchronize, so a GPU that
  // never finishes (a peer's kernel that never comes) ends in an error after
  // MESHRT_COLLECTIVE_TIMEOUT instead of a hang.
  void coll_fence(int device) override {
    Logical& l = dev(device);
    set(device);
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      const cudaError_t st = cudaStreamQuery(l.comm);
      if (st == cudaSuccess) break;
      if (st != cudaErrorNotReady) MESHRT_CUDA_CHECK(st, device);
      if (polls > 200)
        std::this_thread::sleep_for(std::chrono::microseconds(polls > 2000 ? 200 : 20));
      if (std::chrono::steady_clock::now() - start > fence_timeout_) {
        throw Error(
            "[cuda] collective work queued on " + dev_name(device) + " did not finish within " +
            std::to_string(fence_timeout_.count()) +
            " s (MESHRT_COLLECTIVE_TIMEOUT): a kernel is stuck on the GPU; the device is unusable "
            "until the process restarts");
      }
    }
    l.hold.clear();
  }
  void* coll_signal(int device) override {
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
    MESHRT_CUDA_CHECK(cudaEventRecord(ev, l.comm), device);
    return ev;
  }
  void coll_wait_token(int device, void* token) override {
    if (token == nullptr)
      throw Error("[collectives] a peer's progress token is missing; this is a meshrt bug");
    set(device);
    MESHRT_CUDA_CHECK(cudaStreamWaitEvent(dev(device).comm, static_cast<cudaEvent_t>(token), 0),
                      device);
  }
  void coll_release_token(int device, void* token) noexcept override {
    Logical& l = dev(device);
    std::lock_guard<std::mutex> lock(l.events_mu);
    l.spare_events.push_back(static_cast<cudaEvent_t>(token));
  }

  // ---- NCCL

  std::string native_unavailable(const std::vector<int>& group) override {
    for (size_t i = 0; i < group.size(); ++i) {
      for (size_t j = i + 1; j < group.size(); ++j) {
        if (dev(group[i]).gpu == dev(group[j]).gpu) {
          return dev_name(group[i]) + " and " + dev_name(group[j]) +
                 " are logical devices on the same GPU " + std::to_string(dev(group[i]).gpu) +
                 " (MESHRT_CUDA_DEVICES_PER_GPU=" + std::to_string(per_gpu_) +
                 "), and NCCL refuses two ranks on one GPU";
        }
      }
    }
    return "";
  }
  void native_all_reduce(int device, const std::vector<int>& group, FoldOp op, DType dtype,
                         const void* in, void* out, int64_t count) override {
    ncclComm_t c = comm_for(group, device);
    const ncclRedOp_t r = op == FoldOp::max ? ncclMax : op == FoldOp::min ? ncclMin : ncclSum;
    set(device);
    MESHRT_NCCL_CHECK(ncclAllReduce(in, out, static_cast<size_t>(count), nccl_type(dtype), r, c,
                                    dev(device).comm),
                      device, c);
  }
  void native_all_gather(int device, const std::vector<int>& group, const void* in, void* out,
                         int64_t bytes) override {
    ncclComm_t c = comm_for(group, device);
    set(device);
    MESHRT_NCCL_CHECK(
        ncclAllGather(in, out, static_cast<size_t>(bytes), ncclUint8, c, dev(device).comm), device,
        c);
  }
  void native_reduce_scatter(int device, const std::vector<int>& group, DType dtype, const void* in,
                             void* out, int64_t count) override {
    ncclComm_t c = comm_for(group, device);
    set(device);
    MESHRT_NCCL_CHECK(ncclReduceScatter(in, out, static_cast<size_t>(count), nccl_type(dtype),
                                        ncclSum, c, dev(device).comm),
                      device, c);
  }
  void native_send_recv(int device, const std::vector<int>& group,
                        const std::vector<Transfer>& sends,
                        const std::vector<Transfer>& recvs) override {
    ncclComm_t c = comm_for(group, device);
    set(device);
    cudaStream_t s = dev(device).comm;
    MESHRT_NCCL_CHECK(ncclGroupStart(), device, c);
    for (const Transfer& t : sends) {
      MESHRT_NCCL_CHECK(
          ncclSend(t.data, static_cast<size_t>(t.bytes), ncclUint8, static_cast<int>(t.peer), c, s),
          device, c);
    }
    for (const Transfer& t : recvs) {
      MESHRT_NCCL_CHECK(
          ncclRecv(t.data, static_cast<size_t>(t.bytes), ncclUint8, static_cast<int>(t.peer), c, s),
          device, c);
    }
    MESHRT_NCCL_CHECK(ncclGroupEnd(), device, c);
  }

 private:
  Logical& dev(int device) { return *devs_[static_cast<size_t>(device)]; }
  void set(int device) { MESHRT_CUDA_CHECK(cudaSetDevice(dev(device).gpu), device); }
  void sync(int device, cudaStream_t s) {
    set(device);
    MESHRT_CUDA_CHECK(cudaStreamSynchronize(s), device);
  }

  void enable_peer_access() {
    for (int a = 0; a < gpus_; ++a) {
      for (int b = 0; b < gpus_; ++b) {
        if (a == b) continue;
        int can = 0;
        cudaDeviceCanAccessPeer(&can, a, b);
        if (!can) continue;
        cudaSetDevice(a);
        cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
        if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) {
          (void)cudaGetLastError();
        }
        (void)cudaGetLastError();
      }
    }
  }

  // dst = fold of srcs (left to right), in launches of at most kMaxFoldSources sources.
  void fold_chain(int device, int op, DType t, void* dst, int64_t dpitch,
                  const std::vector<const void*>& srcs, int64_t spitch, int64_t len, int64_t rows) {
    cudaStream_t s = dev(device).comm;
    size_t at = 0;
    bool accumulate = false;
    while (at < srcs.size()) {
      const size_t take = std::min(srcs.size() - at, static_cast<size_t>(kMaxFoldSources));
      MESHRT_CUDA_CHECK(launch_fold_rows(s, op, t, dst, dpitch, srcs.data() + at,
                                         static_cast<int>(take), spitch, len, rows, accumulate),
                        device);
      at += take;
      accumulate = true;
    }
  }
  void fold_chain(int device, int op, DType t, void* dst, const std::vector<const void*>& srcs,
                  int64_t len) {
    fold_chain(device, op, t, dst, len, srcs, len, len, 1);
  }

  // Host <-> device through the logical device's pinned buffer, double-buffered: the host-side
  // memcpy of one half overlaps the DMA of the other.
  void staged_copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes) {
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
      MESHRT_CUDA_CHECK(cudaEventSynchronize(l.staged[half]),
                        device);  // this half's last DMA is done
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
  void drain(Logical& l, int device, int half, char* to, size_t n) {
    MESHRT_CUDA_CHECK(cudaEventSynchronize(l.staged[half]), device);
    std::memcpy(to, l.staging + static_cast<size_t>(half) * kStagingBytes, n);
  }

  // The communicators of one group (by logical device, in group order), created together once
  // with ncclCommInitAll and cached for the life of the process.
  ncclComm_t comm_for(const std::vector<int>& group, int device) {
    std::lock_guard<std::mutex> lock(comms_mu_);
    auto& comms = comms_[group];
    if (comms.empty()) {
      std::vector<int> gpus;
      for (int d : group) gpus.push_back(dev(d).gpu);
      comms.resize(group.size());
      MESHRT_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(group.size()), gpus.data()),
                        device, nullptr);
    }
    const auto at = std::find(group.begin(), group.end(), device) - group.begin();
    return comms[static_cast<size_t>(at)];
  }

  std::string reason_;
  std::chrono::duration<double> fence_timeout_{300.0};
  int gpus_ = 0;
  int per_gpu_ = 1;
  std::vector<std::unique_ptr<Logical>> devs_;
  std::mutex comms_mu_;
  std::map<std::vector<int>, std::vector<ncclComm_t>> comms_;  // guarded by comms_mu_
};

}  // namespace
}  // namespace meshrt::cuda

namespace meshrt::backend {
std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<cuda::CudaBackend>(); }
bool cuda_backend_built() { return true; }
}  // namespace meshrt::backend
