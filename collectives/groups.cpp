#include "collectives/groups.h"

#include <algorithm>

namespace meshrt::coll {

GroupLayout make_group_layout(const std::vector<int64_t>& mesh_shape,
                              const std::vector<int>& axes) {
  const size_t rank = mesh_shape.size();
  int64_t total = 1;
  for (int64_t s : mesh_shape) total *= s;
  std::vector<bool> named(rank, false);
  GroupLayout g;
  for (int a : axes) {
    g.axes_key = g.axes_key * static_cast<int64_t>(rank + 1) + a + 1;
    named[static_cast<size_t>(a)] = true;
    g.group_size *= mesh_shape[static_cast<size_t>(a)];
  }
  const int64_t groups = total / g.group_size;
  g.group_of.resize(static_cast<size_t>(total));
  g.index_of.resize(static_cast<size_t>(total));
  g.members.assign(static_cast<size_t>(groups),
                   std::vector<int64_t>(static_cast<size_t>(g.group_size)));
  std::vector<int64_t> c(rank);
  for (int64_t pos = 0; pos < total; ++pos) {
    int64_t rem = pos;
    for (size_t i = rank; i-- > 0;) {
      c[i] = rem % mesh_shape[i];
      rem /= mesh_shape[i];
    }
    int64_t group = 0, index = 0;
    for (size_t i = 0; i < rank; ++i) {
      if (!named[i]) group = group * mesh_shape[i] + c[i];
    }
    for (int a : axes)
      index = index * mesh_shape[static_cast<size_t>(a)] + c[static_cast<size_t>(a)];
    g.group_of[static_cast<size_t>(pos)] = group;
    g.index_of[static_cast<size_t>(pos)] = index;
    g.members[static_cast<size_t>(group)][static_cast<size_t>(index)] = pos;
  }
  return g;
}

}  // namespace meshrt::coll
