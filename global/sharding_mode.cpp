#include "global/sharding_mode.h"

#include <atomic>

#include "core/config.h"

namespace meshrt {
namespace {
// -1: not set by the program yet (MESHRT_SHARDING decides).
std::atomic<int> g_mode{-1};
}  // namespace

void set_sharding_mode(ShardingMode mode) { g_mode.store(static_cast<int>(mode)); }

ShardingMode sharding_mode() {
  const int m = g_mode.load();
  if (m >= 0) return static_cast<ShardingMode>(m);
  return config::explicit_sharding() ? ShardingMode::explicit_ : ShardingMode::auto_;
}

}  // namespace meshrt
