// runtime/visualize.h: jax.debug.visualize_array_sharding as text.
#pragma once

#include <string>

#include "runtime/array.h"
#include "runtime/sharding.h"

namespace meshrt {

// Text picture of which device holds which block, in the layout of
// jax.debug.visualize_array_sharding (no-colour form): 1-D and 2-D shapes only.
std::string visualize_sharding(const Array& x);
// The same picture for an array of `shape` placed by `sharding` (no data needed).
std::string visualize_sharding(const Sharding& sharding, const Shape& shape);

}  // namespace meshrt
