// global/layout.h: an Array's placement per mesh axis, as the global-view rules see it
// (not installed). Each array dimension lists the mesh axes it is split over (major first);
// `partial` lists the axes over which the blocks are addends of a pending sum.
#pragma once

#include <string>
#include <vector>

#include "runtime/array.h"
#include "runtime/mesh.h"
#include "runtime/partition_spec.h"

namespace meshrt::global {

using AxisList = std::vector<std::string>;

struct Layout {
  std::vector<AxisList> dims;
  AxisList partial;
  friend bool operator==(const Layout&, const Layout&) = default;
};

// The layout of `x` (dims padded to its rank); all-empty for a SingleDeviceSharding.
Layout layout_of(const Array& x);
// A layout of `rank` unsharded dimensions.
Layout replicated(size_t rank);
// The spec of a layout, trailing unsharded entries dropped (as JAX prints Auto-mode results).
PartitionSpec spec_of(const Layout& l);
// Product of the sizes of `axes` on `mesh`.
int64_t axes_size(const Mesh& mesh, const AxisList& axes);
// JAX's divisibility rule: per dimension, trailing axes are dropped until the dimension's size
// divides by the product of those left. Returns true when anything was dropped.
bool trim_to_divisible(Layout& l, const Shape& shape, const Mesh& mesh);
// "P('x', None)" or "P('x',) + pending sum over ('y',)".
std::string layout_str(const Layout& l);
// True when `a` is a prefix of `b`.
bool is_prefix(const AxisList& a, const AxisList& b);

}  // namespace meshrt::global
