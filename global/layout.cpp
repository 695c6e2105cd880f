#include "global/layout.h"

#include "core/strings.h"

namespace meshrt::global {

Layout layout_of(const Array& x) {
  Layout l = replicated(x.shape().size());
  if (const std::optional<NamedSharding> named = x.sharding().as_named()) {
    const PartitionSpec& spec = named->spec();
    for (size_t d = 0; d < l.dims.size(); ++d) l.dims[d] = spec[d];
  }
  l.partial = x.pending_sum_axes();
  return l;
}

Layout replicated(size_t rank) {
  Layout l;
  l.dims.resize(rank);
  return l;
}

PartitionSpec spec_of(const Layout& l) {
  size_t n = l.dims.size();
  while (n > 0 && l.dims[n - 1].empty()) --n;
  return PartitionSpec(std::vector<PartitionSpec::Entry>(l.dims.begin(), l.dims.begin() + n));
}

int64_t axes_size(const Mesh& mesh, const AxisList& axes) {
  int64_t p = 1;
  for (const std::string& a : axes) p *= mesh.axis_size(a);
  return p;
}

bool trim_to_divisible(Layout& l, const Shape& shape, const Mesh& mesh) {
  bool dropped = false;
  for (size_t d = 0; d < l.dims.size(); ++d) {
    while (!l.dims[d].empty() && shape[d] % axes_size(mesh, l.dims[d]) != 0) {
      l.dims[d].pop_back();
      dropped = true;
    }
  }
  return dropped;
}

std::string layout_str(const Layout& l) {
  std::string s = spec_of(l).str();
  if (!l.partial.empty()) s += " + pending sum over " + detail::names_tuple(l.partial);
  return s;
}

bool is_prefix(const AxisList& a, const AxisList& b) {
  if (a.size() > b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

}  // namespace meshrt::global
