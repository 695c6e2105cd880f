// Compiled instead of the cuda backend when meshrt is built with MESHRT_BUILD_CUDA=OFF (or
// AUTO without nvcc/NCCL): the cuda platform exists but has no devices and says why.
#include <memory>
#include <string>

#include "backends/backend.h"
#include "core/error.h"

namespace meshrt::backend {
namespace {

class CudaStub final : public Backend {
 public:
  CudaStub() : Backend(/*host_memory=*/false) {}
  std::string_view platform() const override { return "cuda"; }
  int device_count() const override { return 0; }
  std::string unavailable_reason() const override {
    return "meshrt was built without the cuda backend (MESHRT_BUILD_CUDA=OFF, or AUTO found no "
           "nvcc/NCCL); rebuild with -DMESHRT_BUILD_CUDA=ON";
  }
  std::shared_ptr<Buffer> allocate(int, size_t) override { fail(); }
  void deallocate(int, void*, size_t) noexcept override {}
  void copy_2d(void*, int, size_t, const void*, int, size_t, size_t, size_t) override { fail(); }
  void submit(int, std::function<void()>) override { fail(); }
  void unary(int, UnaryOp, DType, DType, const std::vector<int64_t>&, const Strided&,
             void*) override {
    fail();
  }
  void binary(int, BinaryOp, DType, DType, const std::vector<int64_t>&, const Strided&,
              const Strided&, void*) override {
    fail();
  }
  void select(int, DType, const std::vector<int64_t>&, const Strided&, const Strided&,
              const Strided&, void*) override {
    fail();
  }
  void reduce(int, ReduceOp, DType, int64_t, int64_t, int64_t, const void*, void*) override {
    fail();
  }
  void matmul(int, DType, int64_t, int64_t, int64_t, int64_t, const void*, const void*,
              void*) override {
    fail();
  }
  void fill(int, DType, int64_t, double, bool, void*) override { fail(); }
  void synchronize(int) override { fail(); }

 private:
  [[noreturn]] void fail() const { throw Error("[cuda] " + unavailable_reason()); }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaStub>(); }
bool cuda_backend_built() { return false; }

}  // namespace meshrt::backend
