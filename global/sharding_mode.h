// meshrt/sharding_mode.h: whether global-view ops may reshard operands on their own.
//
// auto_ (default): an op whose operands' shardings do not fit reshards them (each reshard is
// logged in the CollectiveLog). explicit_: such a reshard is an Error naming both shardings and
// the fix (out_sharding=, with_sharding_constraint or device_put), as JAX's Explicit mode.
// MESHRT_SHARDING=explicit sets the initial mode.
#pragma once

namespace meshrt {

// How global-view ops treat operands whose shardings do not fit (the file comment has the details).
enum class ShardingMode {
  auto_,      // reshard them, logged in the CollectiveLog (JAX's Auto)
  explicit_,  // throw an Error naming the shardings and the fix (JAX's Explicit)
};

// Sets the mode for the whole process (every thread); takes effect at the next op.
void set_sharding_mode(ShardingMode mode);
// The current mode: MESHRT_SHARDING at start (auto_ when unset), then the last set_sharding_mode.
ShardingMode sharding_mode();

}  // namespace meshrt
