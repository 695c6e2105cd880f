// meshrt/sharding_mode.h: whether global-view ops may reshard operands on their own.
//
// auto_ (default): an op whose operands' shardings do not fit reshards them (each reshard is
// logged in the CollectiveLog). explicit_: such a reshard is an Error naming both shardings and
// the fix (out_sharding=, with_sharding_constraint or device_put), as JAX's Explicit mode.
// MESHRT_SHARDING=explicit sets the initial mode.
#pragma once

namespace meshrt {

enum class ShardingMode { auto_, explicit_ };

void set_sharding_mode(ShardingMode mode);
ShardingMode sharding_mode();

}  // namespace meshrt
