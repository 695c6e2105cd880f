#include "runtime/tensor.h"

#include "backends/backend.h"
#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/detail/copy.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/trace.h"

namespace meshrt {

using detail::cat;

Tensor::Tensor(std::shared_ptr<backend::Buffer> buffer, size_t byte_offset, Shape shape,
               DType dtype, Device device)
    : buffer_(std::move(buffer)),
      byte_offset_(byte_offset),
      shape_(std::move(shape)),
      dtype_(dtype),
      device_(device) {}

void* Tensor::data() const {
  return buffer_ ? static_cast<char*>(buffer_->data()) + byte_offset_ : nullptr;
}

std::string Tensor::str() const {
  return cat("Tensor(", dtype_name(dtype_), shape_str(shape_), " on ", device_.str(), ")");
}

void Tensor::check_item() const {
  if (!valid()) throw Error("[tensor] item() of an empty (default-constructed) Tensor");
  if (size() != 1) {
    throw Error(cat("[tensor] item() needs a tensor of exactly one element, but this ", str(),
                    " has ", size(), "; index it (t[i]) or reduce it (sum, mean) first"));
  }
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.valid()) return os << "Tensor(empty)";
  std::string s = t.str();
  s.pop_back();  // the closing parenthesis
  if (t.size() <= detail::kMaxPrintedElements) {
    std::vector<char> host(t.nbytes());
    t.copy_to_host(host.data(), t.dtype());
    s += cat(", ", detail::values_str(host.data(), t.dtype(), t.shape()));
  }
  return os << s << ")";
}

const Tensor& Tensor::block_until_ready() const {
  if (!valid()) throw Error("[tensor] block_until_ready on an empty (default-constructed) Tensor");
  detail::backend_of(device_).synchronize(device_.local_index());
  return *this;
}

void Tensor::copy_to_host(void* dst, DType expected) const {
  if (!valid()) throw Error("[tensor] to_vector on an empty (default-constructed) Tensor");
  detail::check_host_read(*this, "to_vector");
  if (expected != dtype_) {
    throw Error(cat("[tensor] to_vector<", dtype_cpp_name(expected), "> called on a ",
                    dtype_name(dtype_), " tensor; use to_vector<", dtype_cpp_name(dtype_),
                    "> (or astype first)"));
  }
  detail::copy_box({dst, shape_, Shape(shape_.size(), 0), device_, true},
                   {data(), shape_, Shape(shape_.size(), 0), device_, false}, shape_,
                   dtype_size(dtype_));
}

namespace {
void check_shape(const Shape& shape, std::string_view component) {
  for (int64_t d : shape) {
    if (d < 0) {
      throw Error(cat("[", component, "] shape ", shape_str(shape),
                      " has a negative dimension; dimensions must be >= 0"));
    }
  }
}
}  // namespace

Tensor empty(Shape shape, DType dtype, Device device) {
  check_shape(shape, "tensor");
  size_t bytes = static_cast<size_t>(shape_size(shape)) * dtype_size(dtype);
  if (!detail::is_local(device) && device.id() >= 0) {
    throw Error(cat("[tensor] ", device.str(), " belongs to process ", device.process_index(),
                    " and this is process ", detail::process_layout().rank,
                    ": only this process's devices (local_devices()) hold data here"));
  }
  auto buf = detail::backend_of(device).allocate(device.local_index(), bytes);
  return detail::TensorAccess::make(std::move(buf), 0, std::move(shape), dtype, device);
}

Tensor tensor(const void* data, int64_t count, DType dtype, Shape shape, Device device) {
  check_shape(shape, "tensor");
  if (count != shape_size(shape)) {
    throw Error(cat("[tensor] host data has ", count, " elements but shape ", shape_str(shape),
                    " needs ", shape_size(shape), "; pass exactly prod(shape) elements"));
  }
  Tensor t = empty(shape, dtype, device);
  Shape zero(shape.size(), 0);
  // bool bytes other than 0 and 1 (memory filled from a file or another library) are made 0/1
  // here, so every kernel can read them as bool.
  std::vector<uint8_t> bools;
  if (dtype == DType::bool_) {
    const auto* b = static_cast<const uint8_t*>(data);
    bools.assign(b, b + count);
    for (uint8_t& v : bools) v = v != 0 ? 1 : 0;
    data = bools.data();
  }
  detail::copy_box({t.data(), shape, zero, device, false}, {data, shape, zero, device, true}, shape,
                   dtype_size(dtype));
  return t;
}

void detail::clear_trace_id(Tensor& x) { detail::set_trace_id(x, 0); }

}  // namespace meshrt
