// The cpu platform: N simulated devices sharing host memory, one executor each.
#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "backends/block_cache.h"
#include "backends/cpu/coll_primitives.h"
#include "backends/cpu/kernels.h"
#include "core/config.h"
#include "core/error.h"
#include "core/threads/executor.h"
#include "core/threads/fiber_executor.h"

namespace meshrt::cpu {
namespace {

constexpr size_t kAlignment = 64;

// MESHRT_CPU_EXECUTOR: threads | fibers | auto (fibers when devices outnumber cores).
bool use_fibers(int devices) {
  switch (config::cpu_executor()) {
    case config::CpuExecutor::threads:
      return false;
    case config::CpuExecutor::fibers:
      return true;
    case config::CpuExecutor::automatic:
      break;
  }
  return devices > core::process_cores();
}

class CpuBackend final : public backend::Backend {
 public:
  explicit CpuBackend(int n)
      : Backend(/*host_memory=*/true), stream_stores_(config::cpu_stream_stores()) {
    for (int d = 0; d < n; ++d)
      caches_.push_back(
          std::make_unique<backend::BlockCache>(kCacheLimit, [](void* p) { std::free(p); }));
    configure_blas_threads();
    if (use_fibers(n)) {
      fibers_ = std::make_unique<core::FiberPool>(n, std::min(n, core::process_cores()));
    } else {
      executors_.resize(static_cast<size_t>(n));
      for (auto& e : executors_) e = std::make_unique<core::Executor>();
    }
  }
  std::string_view platform() const override { return "cpu"; }
  int device_count() const override { return static_cast<int>(caches_.size()); }
  std::string unavailable_reason() const override { return ""; }

  std::shared_ptr<backend::Buffer> allocate(int device, size_t bytes) override {
    // Size classes are multiples of the alignment, as aligned_alloc requires; zero-size tensors
    // still get a real pointer.
    const size_t cls = backend::BlockCache::size_class(bytes == 0 ? 1 : bytes);
    void* p = caches_[static_cast<size_t>(device)]->take(cls);
    if (p == nullptr) p = std::aligned_alloc(kAlignment, cls);
    if (p == nullptr) {
      throw Error("[cpu] out of host memory allocating " + std::to_string(bytes) +
                  " bytes on cpu:" + std::to_string(device) +
                  "; reduce the array sizes or the number of simulated devices");
    }
    return std::make_shared<backend::Buffer>(this, device, p, bytes);
  }
  void deallocate(int device, void* data, size_t bytes) noexcept override {
    if (!caches_[static_cast<size_t>(device)]->give(
            data, backend::BlockCache::size_class(bytes == 0 ? 1 : bytes))) {
      std::free(data);
    }
  }

  void copy_2d(void* dst, int, size_t dpitch, const void* src, int, size_t spitch, size_t width,
               size_t height) override {
    cpu::copy_2d(dst, dpitch, src, spitch, width, height);
  }
  void copy_2d_batch(const std::vector<backend::DeviceCopy>& copies) override {
    cpu::copy_2d_batch(copies);
  }

  void unary(int, backend::UnaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
             const backend::Strided& x, void* y) override {
    cpu::unary(op, in, out, shape, x, y);
  }
  void binary(int, backend::BinaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
              const backend::Strided& a, const backend::Strided& b, void* y) override {
    cpu::binary(op, in, out, shape, a, b, y);
  }
  void elementwise_chain(int, const backend::ElementwiseChain& chain,
                         const std::vector<int64_t>& shape,
                         std::span<const backend::Strided> inputs,
                         std::span<void* const> ys) override {
    cpu::elementwise_chain(chain, shape, inputs, ys);
  }
  bool fuses_chain(const backend::ElementwiseChain& chain) const override {
    return cpu::chain_takes(chain);
  }
  void select(int, DType dtype, const std::vector<int64_t>& shape, const backend::Strided& cond,
              const backend::Strided& a, const backend::Strided& b, void* y) override {
    cpu::select(dtype, shape, cond, a, b, y);
  }
  void reduce(int, backend::ReduceOp op, DType dtype, int64_t outer, int64_t len, int64_t inner,
              const void* x, void* y) override {
    cpu::reduce(op, dtype, outer, len, inner, x, y);
  }
  void matmul(int, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, const void* a,
              const void* b, void* c) override {
    cpu::matmul(dtype, batch, m, n, k, a, b, c);
  }
  void matmul_t(int, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, const void* a,
                bool trans_a, const void* b, bool trans_b, void* c) override {
    cpu::matmul(dtype, batch, m, n, k, a, b, c, trans_a, trans_b);
  }
  void fill(int, DType dtype, int64_t n, double value, bool iota, void* y) override {
    cpu::fill(dtype, n, value, iota, y);
  }

  void submit(int device, std::function<void()> task) override {
    if (fibers_) {
      fibers_->submit(device, std::move(task));
    } else {
      executors_[static_cast<size_t>(device)]->submit(std::move(task));
    }
  }

  bool drive(int device, const std::atomic<uint32_t>& done) override {
    return fibers_ && fibers_->drive(device, done);
  }
  bool claim(int device) override { return fibers_ && fibers_->claim(device); }

  // ---- collective primitives on host memory (coll_primitives.h): done when they return, so
  // there is nothing to begin, fence or signal.
  void coll_begin(int) override {}
  void coll_copy_2d(int, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t height) override {
    if (stream_stores_ && width * height >= cpu::kStreamCopyBytes &&
        cpu::copy_rows_streaming(dst, dpitch, src, spitch, width, height)) {
      return;
    }
    cpu::copy_rows(dst, dpitch, src, spitch, width, height);
  }
  void coll_zero(int, void* dst, size_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }
  void coll_fold(int, backend::FoldOp op, DType in, DType out, void* dst,
                 const std::vector<const void*>& srcs, int64_t len) override {
    cpu::fold(op, in, out, dst, srcs, len);
  }
  void coll_fold_to(int, backend::FoldOp op, DType in, DType out, const std::vector<void*>& dsts,
                    const std::vector<const void*>& srcs, int64_t len) override {
    cpu::fold_to(op, in, out, dsts, srcs, len, stream_stores_);
  }
  void coll_fold_rows(int, backend::FoldOp op, DType dtype, void* dst, int64_t dpitch,
                      const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                      int64_t rows) override {
    cpu::fold_rows(op, dtype, dst, dpitch, srcs, spitch, len, rows);
  }
  void coll_mean(int, DType in, DType out, void* dst, const void* sum, int64_t len,
                 int64_t divisor) override {
    if (len > 0) cpu::mean_from_sum(in, out, dst, sum, len, divisor);
  }
  void coll_fence(int) override {}
  void* coll_signal(int) override { return nullptr; }
  void coll_wait_token(int, void*) override {}

 private:
  static constexpr size_t kCacheLimit = size_t{512} << 20;  // per device
  const bool stream_stores_;  // MESHRT_CPU_STREAM_STORES, read when the platform starts
  std::vector<std::unique_ptr<backend::BlockCache>> caches_;
  std::vector<std::unique_ptr<core::Executor>> executors_;  // one thread per device, or
  std::unique_ptr<core::FiberPool> fibers_;                 // devices as fibers on few threads
};

}  // namespace
}  // namespace meshrt::cpu

namespace meshrt::backend {
std::unique_ptr<Backend> make_cpu_backend(int device_count) {
  return std::make_unique<cpu::CpuBackend>(device_count);
}
}  // namespace meshrt::backend
