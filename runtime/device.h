// runtime/device.h: platforms and devices.
//
// The cpu platform simulates N devices in this process, each with its own executor (a worker
// thread), like XLA's forced host device count. The cuda platform lists GPUs (and, later,
// several logical devices per GPU). Platform state is process-wide and thread-safe.
//
// Under mpirun, after distributed::initialize() (runtime/distributed.h), devices() lists every
// process's devices ordered (process, local index), as jax.devices(); local_devices() lists this
// process's, the only ones that hold data here (addressable).
#pragma once

#include <cstddef>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace meshrt {

class Device;
namespace detail {
struct DeviceAccess;  // runtime/detail/access.h
}  // namespace detail

// A device: cheap value type, comparable and hashable. Obtain devices from devices().
class Device {
 public:
  Device() = default;
  // Unique in the job: cpu devices are process * kProcessIdStride + local index, cuda devices
  // the same plus kCudaIdBase (one process: cpu 0..N-1).
  int id() const { return id_; }
  // The process whose device this is (0 when the program runs as one process).
  int process_index() const { return process_index_; }
  // "cpu" or "cuda".
  std::string_view platform() const;
  // Index within its platform in its process.
  int local_index() const { return local_index_; }
  // "cpu:3", "cuda:0"; with several processes the process comes first: "p1:cpu:3".
  std::string str() const;

  // Same id(), i.e. the same device.
  friend bool operator==(const Device& a, const Device& b) { return a.id_ == b.id_; }
  // Ordered by id(): devices() order.
  friend auto operator<=>(const Device& a, const Device& b) { return a.id_ <=> b.id_; }

  // Added to a cuda device's id, so cpu and cuda ids never collide.
  static constexpr int kCudaIdBase = 1 << 20;
  // Ids of process p start at p * kProcessIdStride.
  static constexpr int kProcessIdStride = 4096;

  // The platforms, as an enum.
  enum class Kind : unsigned char {
    cpu,   // a simulated device of the cpu platform
    cuda,  // a (logical) GPU of the cuda platform
  };
  // The platform, as an enum (platform() names it).
  Kind kind() const { return kind_; }

 private:
  // The device `local_index` of a platform in process `process_index`: devices are made by the
  // platform registry (detail::DeviceAccess).
  Device(Kind kind, int local_index, int process_index = 0);
  friend struct detail::DeviceAccess;

  int id_ = -1;
  int local_index_ = -1;
  int process_index_ = 0;
  Kind kind_ = Kind::cpu;
};

// Prints str(): "cpu:3".
inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

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
  int64_t bytes_in_use = 0;       // held now
  int64_t peak_bytes_in_use = 0;  // the most held at once since the start or the last reset
};
// The current MemoryStats (jax.Device.memory_stats, summed over devices). Thread-safe.
MemoryStats memory_stats();
// Starts a new peak: peak_bytes_in_use becomes bytes_in_use. Thread-safe.
void reset_peak_memory_stats();

// This process's devices of a platform (devices() filtered to process_index()), in local index
// order; the same storage on every call, like devices(). One process: the same as devices().
const std::vector<Device>& local_devices(std::string_view platform = "");

// This process's index in the job, 0..process_count()-1 (jax.process_index); 0 and 1 when the
// program runs as one process or before distributed::initialize().
int process_index();
// Number of processes in the job (jax.process_count); 1 without distributed::initialize().
int process_count();

}  // namespace meshrt

// Hashes a Device by its id(), for unordered containers.
template <>
struct std::hash<meshrt::Device> {
  // The hash of d.id().
  size_t operator()(const meshrt::Device& d) const noexcept { return std::hash<int>()(d.id()); }
};
