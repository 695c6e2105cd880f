// The core library's side of the cuda platform: make_cuda_backend() loads the cuda plugin
// (libmeshrt_cuda.so, backends/plugin.h) on first use; where it is absent or cannot load, the cuda
// platform is a stub with no devices whose unavailable_reason() says why (not built, not found,
// or the library it needs that is missing). No CUDA header or library here.
#include <memory>
#include <string>

#include "backends/backend.h"
#include "backends/plugin.h"
#include "core/error.h"

namespace meshrt::backend {
namespace {

constexpr const char* kFile = "libmeshrt_cuda.so";

class CudaStub final : public Backend {
 public:
  explicit CudaStub(std::string reason)
      : Backend(/*host_memory=*/false), reason_(std::move(reason)) {}
  std::string_view platform() const override { return "cuda"; }
  int device_count() const override { return 0; }
  std::string unavailable_reason() const override { return reason_; }
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
  [[noreturn]] void fail() const { throw Error("[cuda] " + reason_); }
  std::string reason_;
};

std::string why_not(const Plugin& p) {
#ifndef MESHRT_CUDA_PLUGIN_BUILT
  if (plugin_file_absent(p, kFile)) {
    return "meshrt was built without the cuda platform (MESHRT_BUILD_CUDA=OFF, or AUTO found no "
           "nvcc/NCCL), so there is no libmeshrt_cuda.so; rebuild with -DMESHRT_BUILD_CUDA=ON";
  }
#endif
  return std::string("the cuda plugin ") + kFile + " could not be loaded: " + p.why +
         " (looked in: " + p.path +
         "); keep it next to libmeshrt, or set MESHRT_PLUGIN_DIR to its folder";
}

const Plugin& plugin() { return load_plugin(kFile, "meshrt_cuda_backend"); }

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  const Plugin& p = plugin();
  if (p.entry != nullptr) {
    auto make = reinterpret_cast<Backend* (*)()>(p.entry);
    return std::unique_ptr<Backend>(make());
  }
  return std::make_unique<CudaStub>(why_not(p));
}

bool cuda_backend_built() { return plugin().entry != nullptr; }

}  // namespace meshrt::backend
