// runtime/array.h: a global array spread over devices, and device_put.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
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
  Device device;  // the device holding it
  Index index;    // [start, stop) per dimension of the global array
  Tensor data;    // the block, on `device`
};

// Array: a global array: a shape, a dtype, a sharding, and one block per device of the sharding
// (replicated blocks are separate copies, as in JAX). Immutable and cheap to copy (copies share
// the blocks); thread-safe to read from several threads.
//
// A default-constructed Array is empty, a placeholder to assign later (like a Python variable
// bound to None): valid() is false, size() is 0, shape() is () and sharding() names no mesh.
// Every use of its value is an Error that says it is empty: an op, to_vector, item,
// addressable_shards, device(), block_until_ready, device_put, shard_map, jit. Donation (jit's
// donate_argnums) leaves the donated Arrays empty too, as JAX deletes donated arrays.
class Array;
namespace detail {
struct SumCache;
struct ArrayAccess;
// `x` itself when it has no pending sums, else the summed Array (summed once per Array).
Array resolve_pending_sums(const Array& x);
// An Array whose value is held in another layout (`value`) than its sharding shows; its blocks
// are made by `make_blocks` only when something reads blocks(). Two kinds, one mechanism:
//   * a deferred pending sum: a pending sum over `pending_sum_axes` (non-empty) whose value is
//     already summed (the global view's matmul computed as rows); resolving it moves `value`,
//     and make_blocks makes its addends (a linear op keeping the sum reads them);
//   * a value kept in another layout (make_kept_in_another_layout, no pending axes): the global
//     view's product kept as rows; make_blocks moves `value` into `sharding` when first read.
Array make_deferred_pending_sum(Shape shape, DType dtype, Sharding sharding,
                                std::vector<std::string> pending_sum_axes, Array value,
                                std::function<std::vector<Tensor>()> make_blocks);
Array make_kept_in_another_layout(Shape shape, DType dtype, Sharding sharding, Array value,
                                  std::function<std::vector<Tensor>()> make_blocks);
// The one constructor behind both.
Array make_held_elsewhere(Shape shape, DType dtype, Sharding sharding,
                          std::vector<std::string> pending_sum_axes, Array value,
                          std::function<std::vector<Tensor>()> make_blocks);
// The value of an Array held in another layout (either kind above), or null for any other Array.
const Array* value_elsewhere(const Array& x);
// Work the global view has planned and placed but not launched: an Array made by
// make_deferred_launch runs it when something first reads its blocks (to_vector, an op, a
// shard_map, jit), once, shared by copies. The global view defers a layer's product on a platform
// that fuses a product's epilogue, so that relu(x @ W + b) written as one expression is one call
// (global/array_ops.cpp, `PendingLayer`).
struct DeferredLaunch {
  virtual ~DeferredLaunch() = default;
  // The blocks, in the sharding's device order.
  virtual std::vector<Tensor> run() const = 0;
};
Array make_deferred_launch(Shape shape, DType dtype, Sharding sharding,
                           std::shared_ptr<const DeferredLaunch> launch);
// The launch `x` still waits on (nothing has read its blocks yet), else null.
std::shared_ptr<const DeferredLaunch> pending_launch(const Array& x);
void set_pending_sum_origin(const Array& x, std::string origin);
std::string pending_sum_origin(const Array& x);
}  // namespace detail

// A global array over the devices of its sharding (jax.Array); see the comment above.
class Array {
 public:
  // An empty Array: valid() is false (see above).
  Array() = default;
  // False for a default-constructed (or donated) Array: it holds no value.
  bool valid() const { return !blocks_.empty() || deferred_; }
  // The global shape (not the block's): () for an empty Array.
  const Shape& shape() const { return shape_; }
  // The element type.
  DType dtype() const { return dtype_; }
  // Where the blocks live (jax.Array.sharding).
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
  // Row i of the leading dimension (negative counts from the end), as x[i] in jnp. C++ makes
  // operator[] a member, so it is declared here, but indexing an Array is a global-view op (a
  // slice and a reshape, placed by global/'s rules, which runtime/ sits below): it is defined
  // with those ops, as row(x, i) (global/array_ops.cpp), in the same library.
  Array operator[](int64_t i) const;
  // Number of elements: prod(shape()); 0 for an empty Array (!valid()).
  int64_t size() const { return valid() ? shape_size(shape_) : 0; }
  // One Shard per device, in the sharding's device order (mesh.devices.flat).
  std::vector<Shard> addressable_shards() const;
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
  // The one element of a one-element Array (any shape of size 1), as jax.Array.item(): the loss
  // of a training step is `loss.item<float>()`. T must match dtype() exactly; an Array of more
  // (or no) elements, or an empty one, is an Error.
  template <class T>
  T item() const {
    check_item();
    return to_vector<T>()[0];
  }
  // "Array(float32(2, 2), sharding=NamedSharding(mesh=Mesh('x': 2), spec=P('x',)))": dtype,
  // shape and sharding ("Array(empty)" when !valid(); pending sums are named).
  std::string str() const;

 private:
  // meshrt's own layers assemble Arrays from blocks and read them (runtime/detail/access.h).
  friend struct detail::ArrayAccess;
  // Assembles an Array from per-device blocks (checked against the sharding).
  Array(Shape shape, DType dtype, Sharding sharding, std::vector<Tensor> blocks);
  // The same with pending sums over `pending_sum_axes` (mesh axes of the sharding).
  Array(Shape shape, DType dtype, Sharding sharding, std::vector<Tensor> blocks,
        std::vector<std::string> pending_sum_axes);
  // The block held by each device, in the sharding's device order (the addends of pending sums).
  const std::vector<Tensor>& blocks() const { return deferred_ ? deferred_blocks() : blocks_; }
  void check_item() const;
  const std::vector<Tensor>& deferred_blocks() const;
  Shape shape_;
  DType dtype_ = DType::f32;
  Sharding sharding_ = SingleDeviceSharding(Device());
  std::vector<Tensor> blocks_;
  std::vector<std::string> pending_sum_axes_;
  std::shared_ptr<detail::SumCache> sum_cache_;  // with pending sums: the sum, once taken
  uint64_t trace_id_ = 0;  // which traced value this is (autodiff, jit); 0 when none follows it
  // Held in another layout (make_deferred_pending_sum, make_kept_in_another_layout) or not yet
  // launched (make_deferred_launch): blocks() makes the blocks when first read.
  bool deferred_ = false;
  friend Array detail::resolve_pending_sums(const Array& x);
  friend Array detail::make_held_elsewhere(Shape, DType, Sharding, std::vector<std::string>, Array,
                                           std::function<std::vector<Tensor>()>);
  friend const Array* detail::value_elsewhere(const Array& x);
  friend Array detail::make_deferred_launch(Shape, DType, Sharding,
                                            std::shared_ptr<const detail::DeferredLaunch>);
  friend std::shared_ptr<const detail::DeferredLaunch> detail::pending_launch(const Array& x);
  friend void detail::set_pending_sum_origin(const Array& x, std::string origin);
  friend std::string detail::pending_sum_origin(const Array& x);
};

namespace detail {
// Sums an Array's pending addends (installed by the global-view layer, which makes them).
using PendingSumResolver = Array (*)(const Array&);
void set_pending_sum_resolver(PendingSumResolver resolver);
// The op that made an Array's pending sum ("sum", "matmul", "gradient of w1 (matmul)"), which
// the CollectiveLog names when the sum is taken later; shared by copies. Empty when unknown or
// when `x` has no pending sums (set is then a no-op).
void set_pending_sum_origin(const Array& x, std::string origin);
std::string pending_sum_origin(const Array& x);
// Sets `x`'s trace id to 0 (no tape follows this handle): what jit hands back from its trace.
void clear_trace_id(Array& x);
}  // namespace detail

// Prints str() with the global value when it has at most 100 elements, as JAX's repr does:
//   Array(float32(2, 2), sharding=NamedSharding(mesh=Mesh('x': 2), spec=P('x',)),
//         values=[[0., 1.], [2., 3.]])
// (one line). Reading the values waits for them and takes pending sums (as to_vector does); a
// value other processes hold prints without them.
std::ostream& operator<<(std::ostream& os, const Array& x);

// Places host data (row-major, prod(shape) elements) on the devices of `to`.
Array device_put(const void* data, int64_t count, DType dtype, Shape shape, const Sharding& to);
// Places typed host data on the devices of `to` (jax.device_put); the dtype is dtype_v<T>.
template <class T>
Array device_put(std::span<const T> data, Shape shape, const Sharding& to) {
  return device_put(data.data(), static_cast<int64_t>(data.size()), dtype_v<T>, std::move(shape),
                    to);
}
// The same from a std::vector (std::vector<bool> included, as DType::bool_).
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
