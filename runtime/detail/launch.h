// runtime/detail/launch.h: the state of one shard_map call (not installed).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/groups.h"
#include "collectives/rendezvous.h"
#include "runtime/mesh.h"

namespace meshrt::detail {

struct Launch {
  Launch(Mesh m, std::chrono::milliseconds timeout, bool oversubscribed);
  // The device groups for a tuple of mesh axes (names and their positions in the mesh), built
  // once per launch.
  const coll::GroupLayout& layout(const std::vector<std::string>& names,
                                  const std::vector<int>& axes);

  Mesh mesh;
  coll::Session session;
  bool host_addressable;
  std::string env_algo;            // MESHRT_COLLECTIVE_ALGO, read once per launch
  bool env_deterministic = false;  // MESHRT_DETERMINISTIC=1

 private:
  std::mutex mu_;
  std::map<std::vector<int>, std::unique_ptr<coll::GroupLayout>> layouts_;  // guarded by mu_
};

// MESHRT_COLLECTIVE_TIMEOUT in seconds (default 300); a bad value is an Error.
std::chrono::milliseconds collective_timeout();

}  // namespace meshrt::detail
