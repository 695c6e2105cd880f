// collectives/groups.h: which devices take part together in a collective over some mesh axes.
//
// As in JAX (pxla._axis_groups): devices sharing their coordinates on every axis NOT named form a
// group; a device's index inside its group is the mixed-radix number over the named axes in
// the order written, first name major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshrt::coll {

struct GroupLayout {
  std::vector<std::string> axis_names;  // the axes as written (for messages and Calls)
  int64_t group_size = 1;
  std::vector<int64_t> group_of;              // per mesh position
  std::vector<int64_t> index_of;              // per mesh position: index within its group
  std::vector<std::vector<int64_t>> members;  // per group: mesh positions by group index
  // The named axes' positions as digits base (mesh rank + 1): equal on every process for the
  // same axes tuple, distinct between tuples (names groups across processes).
  int64_t axes_key = 0;
};

// `axes`: positions (in the mesh shape) of the named axes, in the order written; distinct.
GroupLayout make_group_layout(const std::vector<int64_t>& mesh_shape, const std::vector<int>& axes);

}  // namespace meshrt::coll
