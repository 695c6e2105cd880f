// The platform registry: which backends exist, how many cpu devices, the default platform.
#include "runtime/device.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backends/backend.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/threads/executor.h"
#include "runtime/detail/access.h"
#include "runtime/detail/kernel_tape.h"
#include "runtime/detail/platform.h"

namespace meshrt {
namespace {

using detail::cat;

constexpr int kMaxCpuDevices = config::kMaxCpuDevices;

struct Registry {
  std::mutex mu;
  int requested_cpu = 0;                        // guarded by mu; 0 = not set
  bool cpu_chosen = false;                      // guarded by mu: set_cpu_device_count was called
  std::unique_ptr<backend::Backend> cpu_owner;  // guarded by mu
  std::vector<Device> cpu_devices;              // written with cpu_owner, before cpu is published
  std::atomic<backend::Backend*> cpu{nullptr};  // published once cpu_owner is built
  std::once_flag cuda_once;
  std::unique_ptr<backend::Backend> cuda;  // written once under cuda_once
  // Device lists (global, and this process's), built on first use after the process layout.
  std::once_flag cpu_lists_once, cuda_lists_once;
  std::vector<Device> cpu_local, cuda_devices, cuda_local;
  std::atomic<bool> lists_built{false};
  detail::ProcessLayout layout;  // written by set_process_layout before any list is built
};

// Leaked on purpose: executors may still run while static destructors do.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

// A platform's device lists, built once: every process's devices ordered (process, local
// index), and this process's. devices() and local_devices() hand out this storage.
void build_lists(Device::Kind kind, const backend::Backend& b, std::vector<Device>& all,
                 std::vector<Device>& local) {
  Registry& r = registry();
  r.lists_built.store(true);
  std::vector<int> counts = kind == Device::Kind::cpu ? r.layout.cpu_counts : r.layout.cuda_counts;
  if (counts.empty()) counts.assign(static_cast<size_t>(r.layout.size), b.device_count());
  counts[static_cast<size_t>(r.layout.rank)] = b.device_count();
  for (int p = 0; p < r.layout.size; ++p) {
    for (int i = 0; i < counts[static_cast<size_t>(p)]; ++i) {
      all.push_back(detail::DeviceAccess::make(kind, i, p));
      if (p == r.layout.rank) local.push_back(all.back());
    }
  }
}

backend::Backend& cpu_backend() {
  Registry& r = registry();
  if (auto* b = r.cpu.load(std::memory_order_acquire)) return *b;
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.cpu_owner) {
    int n = r.requested_cpu > 0 ? r.requested_cpu : config::cpu_devices();
    r.cpu_owner = backend::make_cpu_backend(n);
    r.cpu.store(r.cpu_owner.get(), std::memory_order_release);
  }
  return *r.cpu_owner;
}

backend::Backend& cuda_backend() {
  Registry& r = registry();
  std::call_once(r.cuda_once, [&] { r.cuda = backend::make_cuda_backend(); });
  return *r.cuda;
}

}  // namespace

Device::Device(Kind kind, int local_index, int process_index)
    : id_((kind == Kind::cpu ? 0 : kCudaIdBase) + process_index * kProcessIdStride + local_index),
      local_index_(local_index),
      process_index_(process_index),
      kind_(kind) {}

std::string_view Device::platform() const { return kind_ == Kind::cpu ? "cpu" : "cuda"; }

std::string Device::str() const {
  if (id_ < 0) return "<no device>";
  // Plain appends, no stream: every launch names its devices.
  std::string s;
  if (registry().layout.size > 1) s += "p" + std::to_string(process_index_) + ":";
  s += platform();
  s += ':';
  s += std::to_string(local_index_);
  return s;
}

void set_cpu_device_count(int n) {
  if (n < 1 || n > kMaxCpuDevices) {
    throw Error(cat("[devices] set_cpu_device_count(", n, "): the count must be between 1 and ",
                    kMaxCpuDevices));
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.cpu_owner) {
    int have = r.cpu_owner->device_count();
    if (have == n) {
      r.cpu_chosen = true;
      return;
    }
    throw Error(cat("[devices] set_cpu_device_count(", n,
                    ") called after the cpu platform was "
                    "initialised with ",
                    have,
                    " device(s); call it before any other meshrt call "
                    "(devices, make_mesh, device_put), or set MESHRT_CPU_DEVICES=",
                    n));
  }
  r.requested_cpu = n;
  r.cpu_chosen = true;
}

std::vector<std::string> platforms() {
  std::vector<std::string> out{"cpu"};
  if (cuda_backend().device_count() > 0) out.emplace_back("cuda");
  return out;
}

std::string default_platform() {
  if (std::string p = config::platform(); !p.empty()) return p;
  {  // an explicit set_cpu_device_count(n) means the program runs on cpu
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.cpu_chosen) return "cpu";
  }
  return cuda_backend().device_count() > 0 ? "cuda" : "cpu";
}

namespace {
// The global and local lists of a platform.
std::pair<const std::vector<Device>*, const std::vector<Device>*> lists(std::string_view platform) {
  std::string p = platform.empty() ? default_platform() : std::string(platform);
  Registry& r = registry();
  if (p == "cpu") {
    backend::Backend& b = cpu_backend();
    std::call_once(r.cpu_lists_once,
                   [&] { build_lists(Device::Kind::cpu, b, r.cpu_devices, r.cpu_local); });
    return {&r.cpu_devices, &r.cpu_local};
  }
  if (p == "cuda") {
    backend::Backend& b = cuda_backend();
    if (b.device_count() == 0) {
      throw Error(cat("[devices] the cuda platform has no usable devices: ", b.unavailable_reason(),
                      "; use devices(\"cpu\") (platforms() lists what is usable)"));
    }
    std::call_once(r.cuda_lists_once,
                   [&] { build_lists(Device::Kind::cuda, b, r.cuda_devices, r.cuda_local); });
    return {&r.cuda_devices, &r.cuda_local};
  }
  throw Error(cat("[devices] unknown platform '", p,
                  "'; meshrt platforms are \"cpu\" and "
                  "\"cuda\" (platforms() lists the usable ones)"));
}
}  // namespace

const std::vector<Device>& devices(std::string_view platform) { return *lists(platform).first; }
const std::vector<Device>& local_devices(std::string_view platform) {
  return *lists(platform).second;
}
int process_index() { return registry().layout.rank; }
int process_count() { return registry().layout.size; }

namespace detail {
backend::Backend& backend_of(Device::Kind kind) {
  backend::Backend& b = kind == Device::Kind::cpu ? cpu_backend() : cuda_backend();
  // While jit records a device-local function's kernels on this thread (kernel_tape.h).
  if (backend::Backend* tape = kernel_tape_for(b)) return *tape;
  return b;
}
backend::Backend& backend_of(const Device& d) {
  if (d.id() < 0)
    throw Error("[devices] use of a default-constructed Device; take one from devices()");
  return backend_of(d.kind());
}
void set_process_layout(ProcessLayout layout) {
  Registry& r = registry();
  if (r.lists_built.load()) {
    throw Error(
        "[distributed] initialize() was called after devices were listed (devices(), make_mesh, "
        "device_put ...); call distributed::initialize() first thing in main()");
  }
  r.layout = std::move(layout);
}
void install_backend_for_testing(Device::Kind kind, std::unique_ptr<backend::Backend> b) {
  if (kind != Device::Kind::cuda || !b) {
    throw Error("[devices] install_backend_for_testing takes a cuda backend");
  }
  Registry& r = registry();
  bool installed = false;
  std::call_once(r.cuda_once, [&] {
    r.cuda = std::move(b);
    installed = true;
  });
  if (!installed) {
    throw Error(
        "[devices] install_backend_for_testing after the cuda platform was first used; call it "
        "first");
  }
}
const ProcessLayout& process_layout() { return registry().layout; }
int local_device_count(Device::Kind kind) { return backend_of(kind).device_count(); }
bool oversubscribed(int64_t devices) { return devices > core::process_cores(); }
}  // namespace detail

MemoryStats memory_stats() {
  return {backend::buffer_bytes_in_use(), backend::buffer_bytes_peak()};
}
void reset_peak_memory_stats() { backend::reset_buffer_bytes_peak(); }

}  // namespace meshrt
