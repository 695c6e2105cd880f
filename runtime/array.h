// runtime/array.h: a global array spread over devices, and device_put.
#pragma once

#include <cstdint>
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
class Array {
 public:
  Array() = default;
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  const Sharding& sharding() const { return sharding_; }
  int64_t size() const { return shape_size(shape_); }
  // One Shard per device, in the sharding's device order (mesh.devices.flat).
  std::vector<Shard> addressable_shards() const;
  // The block held by each device, in the sharding's device order. The reference lives as long
  // as this Array; copy the Tensors to keep blocks beyond it.
  const std::vector<Tensor>& blocks() const { return blocks_; }

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

 private:
  Shape shape_;
  DType dtype_ = DType::f32;
  Sharding sharding_ = SingleDeviceSharding(Device());
  std::vector<Tensor> blocks_;
};

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

}  // namespace meshrt
