// runtime/detail/sharding_impl.h: shape checks with a caller-chosen component (not installed).
#pragma once

#include <string_view>

#include "runtime/sharding.h"

namespace meshrt::detail {

// shard_shape with errors reported as `[component] ...` in the words of that component's JAX
// counterpart (device_put wraps JAX's IndivisibleError text, for example).
Shape checked_shard_shape(const Sharding& s, const Shape& global_shape, std::string_view component);

// The sharding's device list and, per device, its index; computed once per call.
std::vector<Index> indices(const Sharding& s, const Shape& global_shape,
                           std::string_view component);

}  // namespace meshrt::detail
