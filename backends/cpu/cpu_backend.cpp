// The cpu platform: N simulated devices sharing host memory, one executor each.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/executor.h"
#include "runtime/error.h"

namespace meshrt::cpu {
namespace {

constexpr size_t kAlignment = 64;

class CpuBackend final : public backend::Backend {
 public:
  explicit CpuBackend(int n) : executors_(static_cast<size_t>(n)) {
    for (auto& e : executors_) e = std::make_unique<backend::Executor>();
  }
  std::string_view platform() const override { return "cpu"; }
  int device_count() const override { return static_cast<int>(executors_.size()); }
  std::string unavailable_reason() const override { return ""; }
  bool host_addressable() const override { return true; }

  std::shared_ptr<backend::Buffer> allocate(int device, size_t bytes) override {
    // Round up so aligned_alloc's size rule holds; zero-size tensors still get a real pointer.
    size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    if (rounded == 0) rounded = kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) {
      throw Error("[cpu] out of host memory allocating " + std::to_string(bytes) +
                  " bytes on cpu:" + std::to_string(device) +
                  "; reduce the array sizes or the number of simulated devices");
    }
    return std::make_shared<backend::Buffer>(this, device, p, bytes);
  }
  void deallocate(int, void* data, size_t) noexcept override { std::free(data); }

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

  void submit(int device, std::function<void()> task) override {
    executors_[static_cast<size_t>(device)]->submit(std::move(task));
  }

 private:
  std::vector<std::unique_ptr<backend::Executor>> executors_;
};

}  // namespace
}  // namespace meshrt::cpu

namespace meshrt::backend {
std::unique_ptr<Backend> make_cpu_backend(int device_count) {
  return std::make_unique<cpu::CpuBackend>(device_count);
}
}  // namespace meshrt::backend
