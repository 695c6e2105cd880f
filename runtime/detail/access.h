// runtime/detail/access.h: Tensor's and Array's internals, for meshrt's own layers (not installed).
//
// The blocks an Array is made of, the buffer a Tensor views and the trace ids autodiff gives them
// are private to the classes; the layers that build and move values (ops, collectives, launches,
// reshards, jit, autodiff, checkpoints) reach them here, as Abseil's and PJRT's access structs do:
//
//   Tensor view = detail::TensorAccess::make(detail::TensorAccess::buffer(x), offset, shape,
//                                            x.dtype(), x.device());
//   for (const Tensor& b : detail::ArrayAccess::blocks(a)) ...
//
// Trace ids (autodiff's and jit's handles on values) are read and set with detail::trace_id and
// detail::set_trace_id, overloaded for both, so that code written once over Tensor and Array
// reaches them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/array.h"
#include "runtime/sharding.h"
#include "runtime/tensor.h"

namespace meshrt::detail {

// Device's internals.
struct DeviceAccess {
  // The device `local_index` of a platform in process `process_index` (the platform registry
  // makes every Device so).
  static Device make(Device::Kind kind, int local_index, int process_index) {
    return Device(kind, local_index, process_index);
  }
};

// Tensor's internals.
struct TensorAccess {
  // A view of `buffer` starting `byte_offset` bytes in (ops and collectives make tensors so).
  static Tensor make(std::shared_ptr<backend::Buffer> buffer, size_t byte_offset, Shape shape,
                     DType dtype, Device device) {
    return Tensor(std::move(buffer), byte_offset, std::move(shape), dtype, device);
  }
  // The block `t` views, shared with every copy and view of it.
  static const std::shared_ptr<backend::Buffer>& buffer(const Tensor& t) { return t.buffer_; }
  // Where `t`'s element 0 lies in buffer(t), in bytes.
  static size_t byte_offset(const Tensor& t) { return t.byte_offset_; }
  // Which traced value `t` is (autodiff); 0 when no tape follows it. Copies share it.
  static uint64_t trace_id(const Tensor& t) { return t.trace_id_; }
  // Sets trace_id() on this handle.
  static void set_trace_id(Tensor& t, uint64_t id) { t.trace_id_ = id; }
};

// Array's internals.
struct ArrayAccess {
  // Assembles an Array from per-device blocks (checked against the sharding).
  static Array make(Shape shape, DType dtype, Sharding sharding, std::vector<Tensor> blocks) {
    return Array(std::move(shape), dtype, std::move(sharding), std::move(blocks));
  }
  // The same with pending sums over `pending_sum_axes` (mesh axes of the sharding).
  static Array make(Shape shape, DType dtype, Sharding sharding, std::vector<Tensor> blocks,
                    std::vector<std::string> pending_sum_axes) {
    return Array(std::move(shape), dtype, std::move(sharding), std::move(blocks),
                 std::move(pending_sum_axes));
  }
  // The block held by each device, in the sharding's device order. For an Array with pending
  // sums these are the per-device addends (see Array::pending_sum_axes()). The reference lives as
  // long as `x`; copy the Tensors to keep blocks beyond it.
  static const std::vector<Tensor>& blocks(const Array& x) { return x.blocks(); }
  // Which traced value `x` is (autodiff); 0 when no tape follows it. Copies share it.
  static uint64_t trace_id(const Array& x) { return x.trace_id_; }
  // Sets trace_id() on this handle.
  static void set_trace_id(Array& x, uint64_t id) { x.trace_id_ = id; }
  // Names block `pos` of `x` on this handle (copies made afterwards share the name): sets that
  // block's trace id to `id`. jit's recorder names the blocks each launch makes. A no-op on an
  // Array held in another layout, whose blocks every copy shares (the launch making them names
  // them).
  static void set_block_trace_id(Array& x, size_t pos, uint64_t id) {
    if (x.deferred_) return;
    TensorAccess::set_trace_id(x.blocks_.at(pos), id);
  }
};

// The trace ids of either kind of value, for code written once over Tensor and Array (the tracer
// hook, the tape, jit's recorder).
inline uint64_t trace_id(const Tensor& t) { return TensorAccess::trace_id(t); }
inline uint64_t trace_id(const Array& x) { return ArrayAccess::trace_id(x); }
inline void set_trace_id(Tensor& t, uint64_t id) { TensorAccess::set_trace_id(t, id); }
inline void set_trace_id(Array& x, uint64_t id) { ArrayAccess::set_trace_id(x, id); }

}  // namespace meshrt::detail
