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
  return devices > static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

class CpuBackend final : public backend::Backend {
 public:
  explicit CpuBackend(int n) {
    for (int d = 0; d < n; ++d)
      caches_.push_back(
          std::make_unique<backend::BlockCache>(kCacheLimit, [](void* p) { std::free(p); }));
    configure_blas_threads(n);
    if (use_fibers(n)) {
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      fibers_ = std::make_unique<core::FiberPool>(n, std::min(n, cores));
    } else {
      executors_.resize(static_cast<size_t>(n));
      for (auto& e : executors_) e = std::make_unique<core::Executor>();
    }
  }
  std::string_view platform() const override { return "cpu"; }
  int device_count() const override { return static_cast<int>(caches_.size()); }
  std::string unavailable_reason() const override { return ""; }
  bool host_addressable() const override { return true; }

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
    if (width == 0 || height == 0) return;
    if (dpitch == width && spitch == width) {
      std::memcpy(dst, src, width * height);
      return;
    }
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    for (size_t r = 0; r < height; ++r) std::memcpy(d + r * dpitch, s + r * spitch, width);
  }

  void unary(int, backend::UnaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
             const backend::Strided& x, void* y) override {
    cpu::unary(op, in, out, shape, x, y);
  }
  void binary(int, backend::BinaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
              const backend::Strided& a, const backend::Strided& b, void* y) override {
    cpu::binary(op, in, out, shape, a, b, y);
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

 private:
  static constexpr size_t kCacheLimit = size_t{512} << 20;  // per device
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
