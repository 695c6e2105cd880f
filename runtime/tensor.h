// runtime/tensor.h: one device's dense, row-major block of data.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
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
namespace detail {
struct TensorAccess;
}

// Tensor: a dense row-major block on one device. Tensors are immutable values: copying a Tensor
// shares its memory (a block), which is freed when the last Tensor (or Array) referring to it
// goes; reshape, squeeze and expand_dims return views sharing their operand's block. cpu memory
// is 64-byte aligned. Thread-safe: any number of threads may read and copy one Tensor.
//
//   Tensor t = tensor(std::vector<float>{1, 2, 3, 4}, {2, 2}, devices()[0]);
//   std::vector<float> host = (t * 2.0).to_vector<float>();
class Tensor {
 public:
  // An empty handle: valid() is false, and ops on it are an Error.
  Tensor() = default;
  // The dimensions, row-major.
  const Shape& shape() const { return shape_; }
  // The element type.
  DType dtype() const { return dtype_; }
  // The device holding the block.
  Device device() const { return device_; }
  // Number of elements, prod(shape()).
  int64_t size() const { return shape_size(shape_); }
  // Number of dimensions (0 for a scalar).
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  // Bytes of the elements, size() * dtype_size(dtype()).
  size_t nbytes() const { return static_cast<size_t>(size()) * dtype_size(dtype_); }
  // False for a default-constructed Tensor.
  bool valid() const { return buffer_ != nullptr; }
  // "Tensor(float32(2, 4) on cpu:3)".
  std::string str() const;
  // t[i]: row i of the leading dimension (negative counts from the end), as jnp indexing: a view
  // of shape shape()[1:] sharing this tensor's block. Defined with the ops (tensor_ops.cpp).
  Tensor operator[](int64_t i) const;

  // Returns once this tensor's block, and the work that produced it, is complete on its device
  // (ops on cuda are queued and return at once); a failure of the queued work is raised here.
  const Tensor& block_until_ready() const;

  // Copies the data to the host. T must match dtype() exactly, else an Error.
  template <class T>
  std::vector<T> to_vector() const {
    return detail::read_to_host<T>(size(), [this](void* dst, DType t) { copy_to_host(dst, t); });
  }
  // The one element of a one-element tensor (any shape of size 1), as jax.Array.item(): T must
  // match dtype() exactly; more or fewer elements, or an empty Tensor, is an Error.
  template <class T>
  T item() const {
    check_item();
    return to_vector<T>()[0];
  }

  // Device address of element 0 (a host pointer on cpu; nullptr when not valid()). Valid while
  // any Tensor or Array shares the block, not merely while this Tensor lives: keep a Tensor for as
  // long as the pointer is used. For reading: only an op writes, into a tensor it just made.
  void* data() const;
  // Copies the elements to host memory at `dst` (size() elements); `expected` must be dtype().
  void copy_to_host(void* dst, DType expected) const;

 private:
  // meshrt's own layers make views of buffers and read trace ids (runtime/detail/access.h).
  friend struct detail::TensorAccess;
  // A view of `buffer` starting `byte_offset` bytes in (ops and collectives make tensors so).
  Tensor(std::shared_ptr<backend::Buffer> buffer, size_t byte_offset, Shape shape, DType dtype,
         Device device);
  void check_item() const;
  std::shared_ptr<backend::Buffer> buffer_;  // the block, shared with every copy and view
  size_t byte_offset_ = 0;                   // where element 0 lies in buffer_, in bytes
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_;
  uint64_t trace_id_ = 0;  // which traced value this is (autodiff, jit); 0 when none follows it
};

namespace detail {
// Sets `x`'s trace id to 0 (no tape follows this handle): what jit hands back from its trace.
void clear_trace_id(Tensor& x);
}  // namespace detail

// Allocates an uninitialised tensor (internal building block of ops and collectives); its
// elements are unspecified until written through data().
Tensor empty(Shape shape, DType dtype, Device device);

// Copies host data into a new tensor on `device`; data.size() must equal prod(shape).
Tensor tensor(const void* data, int64_t count, DType dtype, Shape shape, Device device);
// Copies typed host data into a new tensor on `device`; the dtype is dtype_v<T>.
template <class T>
Tensor tensor(std::span<const T> data, Shape shape, Device device) {
  return tensor(data.data(), static_cast<int64_t>(data.size()), dtype_v<T>, std::move(shape),
                device);
}
// The same from a std::vector (std::vector<bool> included, as DType::bool_).
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

// Prints the tensor as str() does, with its values when it has at most 100 elements:
// "Tensor(float32(2, 2) on cpu:0, [[0, 1.5], [2, 3]])".
std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace meshrt
