#include "collectives/fingerprint.h"

#include <sstream>

namespace meshrt::coll {

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::psum:
      return "psum";
    case Kind::pmean:
      return "pmean";
    case Kind::pmax:
      return "pmax";
    case Kind::pmin:
      return "pmin";
    case Kind::all_gather:
      return "all_gather";
    case Kind::psum_scatter:
      return "psum_scatter";
    case Kind::ppermute:
      return "ppermute";
    case Kind::all_to_all:
      return "all_to_all";
  }
  return "?";
}

std::string Call::str() const {
  std::ostringstream os;
  os << kind_name(kind) << "(" << dtype_name(dtype) << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << "], axes=(";
  const std::vector<std::string> none;
  const auto& names = axes ? *axes : none;
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << "'" << names[i] << "'";
  os << (names.size() == 1 ? ",)" : ")");
  switch (kind) {
    case Kind::all_gather:
      os << ", axis=" << axis << ", tiled=" << (tiled ? "True" : "False");
      break;
    case Kind::psum_scatter:
      os << ", scatter_dimension=" << axis << ", tiled=" << (tiled ? "True" : "False");
      break;
    case Kind::all_to_all:
      os << ", split_axis=" << axis << ", concat_axis=" << axis2
         << ", tiled=" << (tiled ? "True" : "False");
      break;
    case Kind::ppermute:
      os << ", perm=(";
      for (size_t i = 0; i < perm.size(); ++i)
        os << (i ? ", " : "") << "(" << perm[i].first << ", " << perm[i].second << ")";
      os << ")";
      break;
    default:
      break;
  }
  if (algo != Algo::direct) os << ", algo=" << algo_name(algo);
  if (deterministic) os << ", deterministic=True";
  os << ")";
  return os.str();
}

}  // namespace meshrt::coll
