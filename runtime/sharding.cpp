#include "runtime/sharding.h"

#include <algorithm>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/sharding_impl.h"

namespace meshrt {

using detail::cat;

struct Sharding::Impl {
  std::optional<Mesh> mesh;  // set for NamedSharding
  PartitionSpec spec;
  std::vector<Device> devices;
};

namespace {

// Split count per dimension: product of the sizes of the named axes.
std::vector<int64_t> tiling(const Mesh& mesh, const PartitionSpec& spec, size_t rank) {
  std::vector<int64_t> t(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    for (const std::string& a : spec[d]) t[d] *= mesh.axis_size(a);
  }
  return t;
}

std::string tuple_str(const std::vector<int64_t>& v) { return shape_str(v); }

}  // namespace

Shape detail::checked_shard_shape(const Sharding& s, const Shape& global_shape,
                                  std::string_view component) {
  for (int64_t d : global_shape) {
    if (d < 0) {
      throw Error(
          cat("[", component, "] shape ", shape_str(global_shape), " has a negative dimension"));
    }
  }
  const std::optional<NamedSharding> named = s.as_named();
  if (!named) return global_shape;
  const PartitionSpec& spec = named->spec();
  const bool dp = component == "device_put";
  if (spec.size() > global_shape.size()) {
    std::string msg =
        cat("[", component, "] ", dp ? "the target sharding is incompatible with the shape: " : "",
            "Sharding ", s.str(), " is only valid for values of rank at least ", spec.size(),
            ", but was applied to a value of rank ", global_shape.size(), ".");
    if (global_shape.empty()) msg += " For scalars the PartitionSpec should be P()";
    throw Error(msg);
  }
  std::vector<int64_t> t = tiling(named->mesh(), spec, global_shape.size());
  Shape block = global_shape;
  for (size_t d = 0; d < global_shape.size(); ++d) {
    if (global_shape[d] % t[d] != 0) {
      throw Error(cat("[", component, "] ", dp ? "the target sharding " : "", s.str(),
                      " implies that array axis ", d, " is partitioned ", t[d],
                      " times, but the dimension size is ", global_shape[d], " (full shape: ",
                      shape_str(global_shape), ", per-dimension tiling factors: ", tuple_str(t),
                      " should evenly divide the shape); pick mesh axes whose "
                      "sizes divide the dimension, or pad the array"));
    }
    block[d] = global_shape[d] / t[d];
  }
  return block;
}

std::vector<Index> detail::indices(const Sharding& s, const Shape& global_shape,
                                   std::string_view component) {
  Shape block = checked_shard_shape(s, global_shape, component);
  const std::optional<NamedSharding> named = s.as_named();
  std::vector<Index> out;
  if (!named) {
    Index full;
    for (int64_t d : global_shape) full.emplace_back(0, d);
    out.push_back(full);
    return out;
  }
  const Mesh* mesh = &named->mesh();
  const PartitionSpec& spec = named->spec();
  std::vector<std::vector<int>> axis_pos(global_shape.size());
  for (size_t d = 0; d < global_shape.size(); ++d) {
    for (const std::string& a : spec[d]) axis_pos[d].push_back(mesh->axis_position(a));
  }
  out.reserve(static_cast<size_t>(mesh->size()));
  for (int64_t flat = 0; flat < mesh->size(); ++flat) {
    std::vector<int64_t> c = mesh->coords(flat);
    Index idx;
    for (size_t d = 0; d < global_shape.size(); ++d) {
      int64_t k = 0;  // mixed radix over the named axes, first name major
      for (int p : axis_pos[d])
        k = k * mesh->shape()[static_cast<size_t>(p)] + c[static_cast<size_t>(p)];
      idx.emplace_back(k * block[d], (k + 1) * block[d]);
    }
    out.push_back(std::move(idx));
  }
  return out;
}

Shape Sharding::shard_shape(const Shape& global_shape) const {
  return detail::checked_shard_shape(*this, global_shape, "sharding");
}

std::vector<std::pair<Device, Index>> Sharding::devices_indices_map(
    const Shape& global_shape) const {
  std::vector<Index> idx = detail::indices(*this, global_shape, "sharding");
  std::vector<std::pair<Device, Index>> out;
  for (size_t i = 0; i < idx.size(); ++i) out.emplace_back(impl_->devices[i], std::move(idx[i]));
  return out;
}

bool operator==(const Sharding& a, const Sharding& b) {
  const std::optional<NamedSharding> na = a.as_named(), nb = b.as_named();
  if (!na || !nb) return !na && !nb && a.device_list() == b.device_list();
  if (!(na->mesh() == nb->mesh())) return false;
  return detail::same_placement(na->spec(), nb->spec());
}

bool detail::same_placement(const PartitionSpec& a, const PartitionSpec& b) {
  const auto& ea = a.entries();
  const auto& eb = b.entries();
  for (size_t d = 0; d < std::max(ea.size(), eb.size()); ++d) {
    const bool none_a = d >= ea.size() || ea[d].empty(), none_b = d >= eb.size() || eb[d].empty();
    if (none_a != none_b || (!none_a && ea[d] != eb[d])) return false;
  }
  return true;
}

bool Sharding::is_fully_replicated() const {
  if (!impl_->mesh) return true;
  for (const std::string& a : impl_->spec.axes()) {
    if (impl_->mesh->axis_size(a) > 1) return false;
  }
  return true;
}

std::string_view Sharding::platform() const { return impl_->devices.front().platform(); }
const std::vector<Device>& Sharding::device_list() const { return impl_->devices; }
std::optional<NamedSharding> Sharding::as_named() const {
  if (!impl_->mesh) return std::nullopt;
  return NamedSharding(impl_);
}

bool Sharding::same_mesh(const Sharding& other) const {
  return impl_->mesh && other.impl_->mesh && *impl_->mesh == *other.impl_->mesh;
}

bool Sharding::same_domain(const Sharding& other) const {
  if (!impl_->mesh && !other.impl_->mesh) return device_list() == other.device_list();
  return same_mesh(other);
}
const PartitionSpec& Sharding::spec_or_empty() const { return impl_->spec; }

bool Sharding::is_equivalent_to(const Sharding& other, const Shape& global_shape) const {
  if (impl_ == other.impl_) return true;
  std::map<Device, Index> a, b;
  for (auto& [d, i] : devices_indices_map(global_shape)) a.emplace(d, std::move(i));
  for (auto& [d, i] : other.devices_indices_map(global_shape)) b.emplace(d, std::move(i));
  return a == b;
}

std::string Sharding::str() const {
  if (impl_->mesh)
    return cat("NamedSharding(mesh=", impl_->mesh->str(), ", spec=", impl_->spec.str(), ")");
  return cat("SingleDeviceSharding(device=", impl_->devices.front().str(), ")");
}

NamedSharding::NamedSharding(Mesh mesh, PartitionSpec spec) : Sharding(nullptr) {
  for (const std::string& a : spec.axes()) {
    if (mesh.axis_position(a) < 0) {
      throw Error(cat("[sharding] Resource axis: ", a, " of ", spec.str(),
                      " is not found in mesh: ", detail::names_tuple(mesh.axis_names()), "."));
    }
  }
  std::map<std::string, int> uses;
  for (const std::string& a : spec.axes()) ++uses[a];
  std::vector<std::string> dups;
  for (auto& [a, n] : uses) {
    if (n > 1) dups.push_back(a);
  }
  if (!dups.empty()) {
    throw Error(
        cat("[sharding] A single NamedSharding spec specification can map every mesh axis "
            "to at most one positional dimension, but ",
            spec.str(), " has duplicate entries for ",
            detail::join(dups, ", ", [](const std::string& a) { return "`" + a + "`"; })));
  }
  std::vector<Device> devs = mesh.devices();
  impl_ = std::make_shared<Impl>(Impl{std::move(mesh), std::move(spec), std::move(devs)});
}

const Mesh& NamedSharding::mesh() const { return *impl_->mesh; }
const PartitionSpec& NamedSharding::spec() const { return impl_->spec; }

SingleDeviceSharding::SingleDeviceSharding(Device device)
    : Sharding(std::make_shared<Impl>(Impl{std::nullopt, PartitionSpec(), {device}})) {}

Device SingleDeviceSharding::device() const { return impl_->devices.front(); }

}  // namespace meshrt
