// runtime/mesh.h: a named, row-major grid of devices.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "runtime/device.h"

namespace meshrt {

// A Mesh arranges devices of one platform in an n-d grid with named axes, row-major (C order)
// like jax.sharding.Mesh. Cheap to copy (shared, immutable state); thread-safe.
//
//   Mesh mesh = make_mesh({4, 2}, {"data", "model"});   // device id = 2*data + model
class Mesh {
 public:
  // devices: prod(shape) distinct devices of one platform, in row-major order.
  Mesh(std::vector<Device> devices, Shape shape, std::vector<std::string> axis_names);

  // Devices along each axis: {4, 2}.
  const Shape& shape() const;
  // The axis names, one per dimension of shape(): {"data", "model"}.
  const std::vector<std::string>& axis_names() const;
  // Size of a named axis; an unknown name is an Error.
  int64_t axis_size(std::string_view axis) const;
  // Position of a named axis in axis_names(), or -1.
  int axis_position(std::string_view axis) const;
  // Number of devices, prod(shape()).
  int64_t size() const;
  // Row-major order (mesh.devices.flat in JAX); valid while any copy of this Mesh lives.
  const std::vector<Device>& devices() const;
  // The devices' platform: "cpu" or "cuda".
  std::string_view platform() const;
  // Coordinates of the device at flat position `flat`.
  std::vector<int64_t> coords(int64_t flat) const;
  // Flat position of a device in this mesh, or -1.
  int64_t position_of(const Device& d) const;
  // "Mesh('x': 4, 'y': 2)".
  std::string str() const;

  // Same devices in the same order, shape and axis names.
  friend bool operator==(const Mesh& a, const Mesh& b);

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Prints str(): "Mesh('x': 4, 'y': 2)".
inline std::ostream& operator<<(std::ostream& os, const Mesh& m) { return os << m.str(); }

// The first prod(shape) devices of `platform` ("" = default platform) in id order, reshaped
// row-major, like jax.make_mesh on CPU and GPU. Too few devices is an Error that says how to
// get more.
Mesh make_mesh(Shape shape, std::vector<std::string> axis_names, std::string_view platform = "");
// A mesh over the first prod(shape) of `devices`, row-major (jax.make_mesh(..., devices=...)).
Mesh make_mesh(Shape shape, std::vector<std::string> axis_names,
               const std::vector<Device>& devices);
// jax.experimental.mesh_utils.create_device_mesh: the first prod(shape) of `devices` (empty:
// the default platform's devices) in the row-major order of a mesh of `shape`, as a flat list
// for Mesh(devices, shape, names). Too few devices is an Error.
std::vector<Device> create_device_mesh(const Shape& shape, const std::vector<Device>& devices = {});

}  // namespace meshrt
