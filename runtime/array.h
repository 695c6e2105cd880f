// runtime/array.h: a global array spread over devices, and device_put.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "runtime/sharding.h"
#include "runtime/tensor.h"

namespace meshrt {

// One device's piece of an Array: its device, the [start, stop) range it holds per dimension,
// and the data.
struct Shard {
  Device device;
  Index index;
  Tensor data;
};

// Array: a global array: a shape, a dtype, a sharding, and one block per device of the sharding
// (replicated blocks are separate copies, as in JAX). Immutable and cheap to copy (copies share
// the blocks); thread-safe to read from several threads.
class Array;
namespace detail {
struct SumCache;
// `x` itself when it has no pending sums, else the summed Array (summed once per Array).
Array resolve_pending_sums(const Array& x);
}  // namespace detail

class Array {
 public:
  Array() = default;
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  const Sharding& sharding() const { return sharding_; }
  // The one device holding the whole array (a SingleDeviceSharding, or a mesh of one device);
  // an Error for an Array spread over several devices.
  Device device() const;
  // True when every device holds the whole value.
  bool is_fully_replicated() const { return sharding_.is_fully_replicated(); }
  // Returns once every block of this Array, and the work that produced it, is complete on its
  // device (as jax.Array.block_until_ready): ops on a device platform (cuda) are queued and return
  // at once, so time work with this. A failure of the queued work is raised here as an Error.
  // An Array with pending sums takes its sum first (kept for later reads, as to_vector does).
  // On cpu, kernels are complete when an op returns and this returns at once.
  const Array& block_until_ready() const;
  // Row i of the leading dimension (negative counts from the end), as x[i] in jnp; defined with
  // the global-view ops (global/array_ops.cpp).
  Array operator[](int64_t i) const;
  int64_t size() const { return shape_size(shape_); }
  // One Shard per device, in the sharding's device order (mesh.devices.flat).
  std::vector<Shard> addressable_shards() const;
  // The block held by each device, in the sharding's device order. For an Array with pending
  // sums these are the per-device addends (see pending_sum_axes()). The reference lives as long
  // as this Array; copy the Tensors to keep blocks beyond it.
  const std::vector<Tensor>& blocks() const { return blocks_; }
  // Mesh axes over which the blocks are addends of a sum not yet taken (a global-view op's
  // Partial placement, e.g. sum(x, 0) of x sharded on that axis). Empty for Arrays made by
  // device_put or shard_map. sharding() is the sharding the value has once summed; reading the
  // value (to_vector, addressable_shards, device_put, shard_map) sums first, with one psum,
  // once: the sum is kept (shared by copies of this Array) for later reads.
  const std::vector<std::string>& pending_sum_axes() const { return pending_sum_axes_; }

  // Gathers the global value to the host; T must match dtype() exactly. Replicated blocks are
  // read from the first device holding them (mesh order).
  template <class T>
  std::vector<T> to_vector() const {
    return detail::read_to_host<T>(size(), [this](void* dst, DType t) { copy_to_host(dst, t); });
  }
  // The global value into host memory at `dst` (size() elements); `expected` must be dtype().
  void copy_to_host(void* dst, DType expected) const;

  // Internal: assembles an Array from per-device blocks (checked against the sharding).
  Array(Shape shape, DType dtype, Sharding sharding, std::vector<Tensor> blocks);
  // Internal: the same with pending sums over `pending_sum_axes` (mesh axes of the sharding).
  Array(Shape shape, DType dtype, Sharding sharding, std::vector<Tensor> blocks,
        std::vector<std::string> pending_sum_axes);
  // Internal (autodiff): which traced value this is; 0 when no tape follows it. Copies share it.
  uint64_t trace_id() const { return trace_id_; }
  void set_trace_id(uint64_t id) { trace_id_ = id; }

 private:
  Shape shape_;
  DType dtype_ = DType::f32;
  Sharding sharding_ = SingleDeviceSharding(Device());
  std::vector<Tensor> blocks_;
  std::vector<std::string> pending_sum_axes_;
  std::shared_ptr<detail::SumCache> sum_cache_;  // with pending sums: the sum, once taken
  uint64_t trace_id_ = 0;
  friend Array detail::resolve_pending_sums(const Array& x);
};

namespace detail {
// Sums an Array's pending addends (installed by the global-view layer, which makes them).
using PendingSumResolver = Array (*)(const Array&);
void set_pending_sum_resolver(PendingSumResolver resolver);
}  // namespace detail

// Places host data (row-major, prod(shape) elements) on the devices of `to`.
Array device_put(const void* data, int64_t count, DType dtype, Shape shape, const Sharding& to);
template <class T>
Array device_put(std::span<const T> data, Shape shape, const Sharding& to) {
  return device_put(data.data(), static_cast<int64_t>(data.size()), dtype_v<T>, std::move(shape),
                    to);
}
template <class T>
Array device_put(const std::vector<T>& data, Shape shape, const Sharding& to) {
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(data.begin(), data.end());
    return device_put(bytes.data(), static_cast<int64_t>(bytes.size()), DType::bool_,
                      std::move(shape), to);
  } else {
    return device_put(std::span<const T>(data), std::move(shape), to);
  }
}

// Reshards `x` onto `to`. Blocks a device already holds are kept (shared, not copied); only
// the missing ranges move, each from the device that holds it (its own copy first). This is
// the only way to move data between platforms.
Array device_put(const Array& x, const Sharding& to);
// Places one device's Tensor onto `to` (its values are the global value).
Array device_put(const Tensor& x, const Sharding& to);

}  // namespace meshrt
