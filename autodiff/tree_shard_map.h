// autodiff/tree_shard_map.h: tree_shard_map's former path, kept so code that includes it still
// compiles. It lives in runtime/tree_shard_map.h; new code includes that, or <meshrt/meshrt.h>.
#pragma once

#include "runtime/tree_shard_map.h"
