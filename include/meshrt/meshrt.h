// meshrt/meshrt.h: the whole public API, from one header.
//
//   #include <meshrt/meshrt.h>
//   meshrt::set_cpu_device_count(8);
//   auto mesh = meshrt::make_mesh({4, 2}, {"data", "model"});
//   auto x = meshrt::device_put(host, {8, 4}, meshrt::NamedSharding(mesh, meshrt::P("data")));
//   std::cout << meshrt::visualize_sharding(x);
//
// The headers below are spelled from the repository root (core/, runtime/, ...); an install
// puts them under include/meshrt/ in the same folders.
#pragma once

#include "autodiff/autodiff.h"
#include "autodiff/jit.h"
#include "core/dtype.h"
#include "core/error.h"
#include "global/array_ops.h"
#include "global/collective_log.h"
#include "global/sharding_mode.h"
#include "runtime/array.h"
#include "runtime/collective_matmul.h"
#include "runtime/context.h"
#include "runtime/device.h"
#include "runtime/distributed.h"
#include "runtime/mesh.h"
#include "runtime/partition_spec.h"
#include "runtime/random.h"
#include "runtime/shard_map.h"
#include "runtime/sharding.h"
#include "runtime/tensor.h"
#include "runtime/tensor_ops.h"
#include "runtime/tree.h"
#include "runtime/tree_shard_map.h"
#include "runtime/visualize.h"
#include "train/checkpoint.h"
#include "train/optim.h"
