// The cuda platform: one device per visible GPU, cudaMalloc memory, an executor thread bound to
// each GPU. Collectives, kernels, NCCL and logical devices per GPU come with the cuda issue.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/executor.h"

namespace meshrt::cuda {
namespace {

class CudaBackend final : public backend::Backend {
 public:
  CudaBackend() {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      // No driver or no GPU: the platform is built but not usable on this machine.
      reason_ = std::string("no usable GPU: cudaGetDeviceCount returned ") +
                cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
      (void)cudaGetLastError();
      n = 0;
    } else if (n == 0) {
      reason_ = "no GPU found (cudaGetDeviceCount = 0)";
    }
    for (int d = 0; d < n; ++d) {
      executors_.push_back(std::make_unique<backend::Executor>([d] { cudaSetDevice(d); }));
    }
  }
  std::string_view platform() const override { return "cuda"; }
  int device_count() const override { return static_cast<int>(executors_.size()); }
  std::string unavailable_reason() const override { return reason_; }
  bool host_addressable() const override { return false; }

  std::shared_ptr<backend::Buffer> allocate(int device, size_t bytes) override {
    MESHRT_CUDA_CHECK(cudaSetDevice(device), device);
    void* p = nullptr;
    MESHRT_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 64 : bytes), device);
    return std::make_shared<backend::Buffer>(this, device, p, bytes);
  }
  void deallocate(int device, void* data, size_t) noexcept override {
    cudaSetDevice(device);
    cudaFree(data);
  }

  void copy_2d(void* dst, int dst_device, size_t dpitch, const void* src, int src_device,
               size_t spitch, size_t width, size_t height) override {
    if (width == 0 || height == 0) return;
    int dev = dst_device != backend::kHost ? dst_device : src_device;
    if (dev != backend::kHost) MESHRT_CUDA_CHECK(cudaSetDevice(dev), dev);
    // Unified addressing lets one call cover host<->device and device<->device.
    MESHRT_CUDA_CHECK(
        cudaMemcpy2D(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault), dev);
  }


  // Device-local kernels come with the cuda issue; until then every op says so.
  void unary(int, backend::UnaryOp, DType, DType, const std::vector<int64_t>&, const backend::Strided&,
             void*) override { not_yet("elementwise ops"); }
  void binary(int, backend::BinaryOp, DType, DType, const std::vector<int64_t>&, const backend::Strided&,
              const backend::Strided&, void*) override { not_yet("elementwise ops"); }
  void select(int, DType, const std::vector<int64_t>&, const backend::Strided&, const backend::Strided&,
              const backend::Strided&, void*) override { not_yet("where"); }
  void reduce(int, backend::ReduceOp, DType, int64_t, int64_t, int64_t, const void*, void*) override {
    not_yet("reductions");
  }
  void matmul(int, DType, int64_t, int64_t, int64_t, int64_t, const void*, const void*, void*) override {
    not_yet("matmul");
  }
  void fill(int, DType, int64_t, double, bool, void*) override { not_yet("zeros/ones/full/arange"); }

  void submit(int device, std::function<void()> task) override {
    executors_[static_cast<size_t>(device)]->submit(std::move(task));
  }

 private:
  [[noreturn]] static void not_yet(const char* what) {
    throw Error(std::string("[cuda] ") + what + " are not implemented on the cuda platform yet (they come with the "
                "cuda backend's kernels); compute on a cpu mesh, or device_put to cpu");
  }
  std::string reason_;
  std::vector<std::unique_ptr<backend::Executor>> executors_;
};

}  // namespace
}  // namespace meshrt::cuda

namespace meshrt::backend {
std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<cuda::CudaBackend>(); }
bool cuda_backend_built() { return true; }
}  // namespace meshrt::backend
