// runtime/sharding.h: NamedSharding and SingleDeviceSharding, with JAX's shard rule.
//
// For a dimension d whose spec entry names axes (a1, ..., ak), the dimension is split in
// T = M[a1]*...*M[ak] equal blocks and a device at mesh coordinates c holds block
// k = ((c[a1]*M[a2] + c[a2])*M[a3] + ...) (first name major). Axes the spec does not name
// replicate the data.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "runtime/device.h"
#include "runtime/mesh.h"
#include "runtime/partition_spec.h"

namespace meshrt {

class NamedSharding;

// [start, stop) in each dimension.
using Index = std::vector<std::pair<int64_t, int64_t>>;

// A value type describing where the blocks of an array live. NamedSharding and
// SingleDeviceSharding convert to it. Cheap to copy; thread-safe.
class Sharding {
 public:
  // The block shape each device holds; an Error when a dimension is not divisible or the spec
  // is longer than the rank.
  Shape shard_shape(const Shape& global_shape) const;
  // For every device (mesh.devices.flat order): the [start, stop) range it holds per dimension.
  std::vector<std::pair<Device, Index>> devices_indices_map(const Shape& global_shape) const;
  // True when no mesh axis of size > 1 is used.
  bool is_fully_replicated() const;
  // The platform of the devices: "cpu" or "cuda".
  std::string_view platform() const;
  // The devices holding blocks, in mesh.devices.flat order; valid while any copy of this
  // Sharding lives.
  const std::vector<Device>& device_list() const;
  // Same devices holding the same ranges of an array of `global_shape`.
  bool is_equivalent_to(const Sharding& other, const Shape& global_shape) const;
  // "NamedSharding(mesh=Mesh('x': 4), spec=P('x',))" or "SingleDeviceSharding(device=cpu:0)".
  std::string str() const;

  // True when Arrays of the two shardings may meet in one op without device_put: both are on
  // equal meshes, or both are single-device shardings of the same device.
  bool same_domain(const Sharding& other) const;
  // True when both are NamedShardings over equal meshes (specs may differ).
  bool same_mesh(const Sharding& other) const;

  // This sharding as a NamedSharding, or nullopt for a SingleDeviceSharding: JAX's
  // `isinstance(s, NamedSharding)` and the cast in one. The result shares this sharding's
  // immutable state, so the references its mesh() and spec() return stay valid while this
  // Sharding (or any copy of it) lives.
  //
  //   if (std::optional<NamedSharding> named = x.sharding().as_named())
  //     std::cout << named->mesh().str() << " " << named->spec().str();
  std::optional<NamedSharding> as_named() const;
  // The spec of a NamedSharding; an empty spec (P(), fully replicated) for a
  // SingleDeviceSharding.
  const PartitionSpec& spec_or_empty() const;

 protected:
  struct Impl;
  // Made by the subclasses, which build the shared, immutable state.
  explicit Sharding(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  // Shared between copies; never modified after construction.
  std::shared_ptr<const Impl> impl_;
};

// Same devices in the same mesh shape and names, and specs equal up to trailing None (JAX's
// is_equivalent_to, for any array the specs fit); a SingleDeviceSharding equals another on the
// same device.
bool operator==(const Sharding& a, const Sharding& b);
// Prints str() (NamedSharding and SingleDeviceSharding alike).
inline std::ostream& operator<<(std::ostream& os, const Sharding& s) { return os << s.str(); }

namespace detail {
// Whether two specs place blocks alike: equal up to trailing unsharded dimensions (the spec half
// of Sharding ==).
bool same_placement(const PartitionSpec& a, const PartitionSpec& b);
}  // namespace detail

// Blocks placed by a PartitionSpec over a Mesh. The constructor checks the spec against the
// mesh (unknown axes, an axis used twice); shapes are checked when they are given.
class NamedSharding : public Sharding {
 public:
  // jax.sharding.NamedSharding(mesh, spec); an Error for an axis not in the mesh or used twice.
  NamedSharding(Mesh mesh, PartitionSpec spec);
  // The mesh the blocks are placed on.
  const Mesh& mesh() const;
  // How the dimensions map onto the mesh axes.
  const PartitionSpec& spec() const;

 private:
  friend class Sharding;  // as_named() shares its state
  explicit NamedSharding(std::shared_ptr<const Impl> impl) : Sharding(std::move(impl)) {}
};

// The whole array on one device.
class SingleDeviceSharding : public Sharding {
 public:
  // jax.sharding.SingleDeviceSharding(device).
  explicit SingleDeviceSharding(Device device);
  // The device holding the whole array.
  Device device() const;
};

}  // namespace meshrt
