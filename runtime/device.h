// runtime/device.h: platforms and devices.
//
// The cpu platform simulates N devices in this process, each with its own executor (a worker
// thread), like XLA's forced host device count. The cuda platform lists GPUs (and, later,
// several logical devices per GPU). Platform state is process-wide and thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace meshrt {

// A device: cheap value type, comparable and hashable. Obtain devices from devices().
class Device {
 public:
  Device() = default;
  // Unique in the process: cpu devices are 0..N-1, cuda devices start at kCudaIdBase.
  int id() const { return id_; }
  // "cpu" or "cuda".
  std::string_view platform() const;
  // Index within its platform.
  int local_index() const { return local_index_; }
  // "cpu:3", "cuda:0".
  std::string str() const;

  friend bool operator==(const Device& a, const Device& b) { return a.id_ == b.id_; }
  friend auto operator<=>(const Device& a, const Device& b) { return a.id_ <=> b.id_; }

  static constexpr int kCudaIdBase = 1 << 20;

  // Internal: devices are made by the platform registry.
  enum class Kind : unsigned char { cpu, cuda };
  Device(Kind kind, int local_index);
  Kind kind() const { return kind_; }

 private:
  int id_ = -1;
  int local_index_ = -1;
  Kind kind_ = Kind::cpu;
};

// Sets the number of simulated cpu devices. Call it before the cpu platform is first used
// (any devices(), make_mesh, device_put ...); a different count afterwards is an Error.
// Without it, MESHRT_CPU_DEVICES is read, else 1.
void set_cpu_device_count(int n);

// Usable platforms: {"cpu"}, or {"cpu", "cuda"} when a GPU is usable.
std::vector<std::string> platforms();

// The devices of a platform in id order. "" means the default platform: MESHRT_PLATFORM if
// set, else cuda when usable, else cpu. The vector is owned by the runtime and built once per
// platform: every call returns the same storage, valid until the process exits, never modified
// (iterators from two calls delimit one range). Thread-safe.
const std::vector<Device>& devices(std::string_view platform = "");

// The default platform's name (see devices()).
std::string default_platform();

// Bytes of device memory held by live Tensors and Arrays (every device, every platform, this
// process), and the most held at once since the start or reset_peak_memory_stats(). Memory a
// platform's allocator keeps cached for reuse is not counted (JAX's memory_stats bytes_in_use).
struct MemoryStats {
  int64_t bytes_in_use = 0;
  int64_t peak_bytes_in_use = 0;
};
MemoryStats memory_stats();
void reset_peak_memory_stats();

}  // namespace meshrt

template <>
struct std::hash<meshrt::Device> {
  size_t operator()(const meshrt::Device& d) const noexcept { return std::hash<int>()(d.id()); }
};
