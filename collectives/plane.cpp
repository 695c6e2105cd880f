#include "collectives/plane.h"

#include <string>

#include "backends/native_comm.h"
#include "collectives/rendezvous.h"
#include "core/error.h"

namespace meshrt::coll {

backend::NativeComm& Plane::native_comm() const {
  backend::NativeComm* nc = be_->native_comm();
  if (nc == nullptr) {
    throw Error("[collectives] algo native on a platform without a native library (" +
                be_->native_unavailable({}) + "); this is a meshrt bug, please report it");
  }
  return *nc;
}

std::string Plane::direct_reason(const Instance& inst) const {
  std::vector<int> group(static_cast<size_t>(inst.size()));
  for (int64_t j = 0; j < inst.size(); ++j) group[static_cast<size_t>(j)] = inst.slot(j).device;
  return be_->direct_unavailable(group);
}

void Plane::require_direct_slow(const Instance& inst) const {
  const std::string why = direct_reason(inst);
  if (why.empty()) return;
  const Call& c = inst.call();
  throw Error("[" + std::string(kind_name(c.kind)) + "] algo " + std::string(algo_name(c.algo)) +
              " cannot serve this group: " + why);
}

}  // namespace meshrt::coll
