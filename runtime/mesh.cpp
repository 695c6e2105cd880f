#include "runtime/mesh.h"

#include <algorithm>
#include <unordered_set>

#include "core/error.h"
#include "core/strings.h"

namespace meshrt {

using detail::cat;

struct Mesh::Impl {
  std::vector<Device> devices;
  Shape shape;
  std::vector<std::string> names;
};

Mesh::Mesh(std::vector<Device> devices, Shape shape, std::vector<std::string> axis_names) {
  if (shape.size() != axis_names.size()) {
    throw Error(cat("[mesh] the mesh shape ", shape_str(shape), " has ", shape.size(), " axes but ",
                    axis_names.size(), " axis names were given ", detail::names_tuple(axis_names),
                    "; give one name per axis"));
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1) {
      throw Error(cat("[mesh] mesh axis ", detail::quote(axis_names[i]), " has size ", shape[i],
                      "; every mesh axis needs size >= 1"));
    }
    if (axis_names[i].empty()) throw Error("[mesh] mesh axis names must not be empty");
    for (size_t j = 0; j < i; ++j) {
      if (axis_names[j] == axis_names[i]) {
        throw Error(cat("[mesh] duplicate axis name ", detail::quote(axis_names[i]),
                        " in axis_names ", detail::names_tuple(axis_names),
                        "; give each mesh axis a distinct name"));
      }
    }
  }
  if (static_cast<int64_t>(devices.size()) != shape_size(shape)) {
    throw Error(cat("[mesh] a mesh of shape ", shape_str(shape), " needs ", shape_size(shape),
                    " devices but ", devices.size(),
                    " were given; pass exactly prod(shape) "
                    "devices (make_mesh picks them for you)"));
  }
  std::unordered_set<Device> seen;
  for (const Device& d : devices) {
    if (d.id() < 0)
      throw Error("[mesh] a mesh device is default-constructed; take devices from devices()");
    if (!seen.insert(d).second) {
      throw Error(cat("[mesh] device ", d.str(),
                      " appears more than once in the mesh; each "
                      "device may hold one mesh position"));
    }
    if (d.kind() != devices.front().kind()) {
      throw Error(cat("[mesh] a mesh lives on one platform, but it mixes ", devices.front().str(),
                      " and ", d.str(),
                      "; build one mesh per platform and move data with "
                      "device_put"));
    }
  }
  impl_ = std::make_shared<Impl>(Impl{std::move(devices), std::move(shape), std::move(axis_names)});
}

const Shape& Mesh::shape() const { return impl_->shape; }
const std::vector<std::string>& Mesh::axis_names() const { return impl_->names; }
int64_t Mesh::size() const { return static_cast<int64_t>(impl_->devices.size()); }
const std::vector<Device>& Mesh::devices() const { return impl_->devices; }
std::string_view Mesh::platform() const { return impl_->devices.front().platform(); }

int Mesh::axis_position(std::string_view axis) const {
  for (size_t i = 0; i < impl_->names.size(); ++i) {
    if (impl_->names[i] == axis) return static_cast<int>(i);
  }
  return -1;
}

int64_t Mesh::axis_size(std::string_view axis) const {
  int p = axis_position(axis);
  if (p < 0) {
    throw Error(cat("[mesh] axis ", detail::quote(axis), " is not in the mesh axes ",
                    detail::names_tuple(impl_->names)));
  }
  return impl_->shape[static_cast<size_t>(p)];
}

std::vector<int64_t> Mesh::coords(int64_t flat) const {
  std::vector<int64_t> c(impl_->shape.size());
  for (size_t i = c.size(); i-- > 0;) {
    c[i] = flat % impl_->shape[i];
    flat /= impl_->shape[i];
  }
  return c;
}

int64_t Mesh::position_of(const Device& d) const {
  auto it = std::find(impl_->devices.begin(), impl_->devices.end(), d);
  return it == impl_->devices.end() ? -1 : it - impl_->devices.begin();
}

std::string Mesh::str() const {
  std::string s = "Mesh(";
  for (size_t i = 0; i < impl_->names.size(); ++i) {
    if (i) s += ", ";
    s += cat(detail::quote(impl_->names[i]), ": ", impl_->shape[i]);
  }
  return s + ")";
}

bool operator==(const Mesh& a, const Mesh& b) {
  if (a.impl_ == b.impl_) return true;
  return a.impl_->devices == b.impl_->devices && a.impl_->shape == b.impl_->shape &&
         a.impl_->names == b.impl_->names;
}

namespace {
// A shape whose axes are not all >= 1 is refused before devices are counted (a zero axis would
// otherwise read as needing fewer devices than there are); `api` names the call. Returns the
// number of devices the shape needs.
int64_t check_axis_sizes(const char* api, const Shape& shape,
                         const std::vector<std::string>* names) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1) {
      const std::string which = names != nullptr && i < names->size()
                                    ? cat("mesh axis ", detail::quote((*names)[i]))
                                    : cat("axis ", i, " of mesh shape ", shape_str(shape));
      throw Error(cat("[mesh] ", api, ": ", which, " has size ", shape[i],
                      "; every mesh axis needs size >= 1"));
    }
  }
  int64_t need = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (__builtin_mul_overflow(need, shape[i], &need)) {
      throw Error(cat("[mesh] ", api, ": mesh shape ", shape_str(shape),
                      " has more devices than fit in 64 bits"));
    }
  }
  return need;
}
}  // namespace

std::vector<Device> create_device_mesh(const Shape& shape, const std::vector<Device>& devs) {
  const int64_t need = check_axis_sizes("create_device_mesh", shape, nullptr);
  std::vector<Device> all = devs.empty() ? std::vector<Device>(devices()) : devs;
  if (need > static_cast<int64_t>(all.size())) {
    throw Error(cat("[mesh] create_device_mesh: ", all.size(), " devices given but mesh shape ",
                    shape_str(shape), " needs ", need, "; pass more devices or a smaller shape"));
  }
  all.resize(static_cast<size_t>(need));
  return all;
}

Mesh make_mesh(Shape shape, std::vector<std::string> axis_names, const std::vector<Device>& devs) {
  check_axis_sizes("make_mesh", shape, &axis_names);
  std::vector<Device> picked = create_device_mesh(shape, devs);
  return Mesh(std::move(picked), std::move(shape), std::move(axis_names));
}

Mesh make_mesh(Shape shape, std::vector<std::string> axis_names, std::string_view platform) {
  const int64_t need = check_axis_sizes("make_mesh", shape, &axis_names);
  std::vector<Device> all = devices(platform);
  if (need > static_cast<int64_t>(all.size())) {
    std::string how = all.front().platform() == "cpu"
                          ? cat("set MESHRT_CPU_DEVICES=", need, " or call set_cpu_device_count(",
                                need, ") before the first meshrt call")
                          : std::string(
                                "use a smaller mesh or more GPUs (or "
                                "MESHRT_CUDA_DEVICES_PER_GPU)");
    throw Error(cat("[mesh] Number of devices ", all.size(),
                    " must be >= the product of "
                    "mesh_shape ",
                    shape_str(shape), "; ", how));
  }
  all.resize(static_cast<size_t>(need));
  return Mesh(std::move(all), std::move(shape), std::move(axis_names));
}

}  // namespace meshrt
