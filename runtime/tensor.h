// meshrt/tensor.h: one device's dense, row-major block of data.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "runtime/device.h"

namespace meshrt {

namespace backend {
class Buffer;
}

// A dense row-major block on one device. Tensors are immutable values: copying a Tensor
// shares its memory, which is freed when the last Tensor (or Array) referring to it goes.
// cpu memory is 64-byte aligned. Thread-safe to read from several threads.
class Tensor {
 public:
  Tensor() = default;
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t size() const { return shape_size(shape_); }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  size_t nbytes() const { return static_cast<size_t>(size()) * dtype_size(dtype_); }
  // False for a default-constructed Tensor.
  bool valid() const { return buffer_ != nullptr; }
  // "Tensor(float32(2, 4) on cpu:3)".
  std::string str() const;

  // Copies the data to the host. T must match dtype() exactly, else an Error.
  template <class T>
  std::vector<T> to_vector() const {
    return detail::read_to_host<T>(size(), [this](void* dst, DType t) { copy_to_host(dst, t); });
  }

  // Internal: the memory behind the tensor.
  Tensor(std::shared_ptr<backend::Buffer> buffer, size_t byte_offset, Shape shape, DType dtype,
         Device device);
  const std::shared_ptr<backend::Buffer>& buffer() const { return buffer_; }
  size_t byte_offset() const { return byte_offset_; }
  // Device address of element 0 (a host pointer on cpu).
  void* data() const;
  void copy_to_host(void* dst, DType expected) const;

 private:
  std::shared_ptr<backend::Buffer> buffer_;
  size_t byte_offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_;
};

// Allocates an uninitialised tensor (internal building block of ops and collectives).
Tensor empty(Shape shape, DType dtype, Device device);

// Copies host data into a new tensor on `device`; data.size() must equal prod(shape).
Tensor tensor(const void* data, int64_t count, DType dtype, Shape shape, Device device);
template <class T>
Tensor tensor(std::span<const T> data, Shape shape, Device device) {
  return tensor(data.data(), static_cast<int64_t>(data.size()), dtype_v<T>, std::move(shape),
                device);
}
template <class T>
Tensor tensor(const std::vector<T>& data, Shape shape, Device device) {
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(data.begin(), data.end());
    return tensor(bytes.data(), static_cast<int64_t>(bytes.size()), DType::bool_, std::move(shape),
                  device);
  } else {
    return tensor(std::span<const T>(data), std::move(shape), device);
  }
}

}  // namespace meshrt
