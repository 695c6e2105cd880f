// meshrt/meshrt.h: the whole public API.
//
//   #include <meshrt/meshrt.h>
//   meshrt::set_cpu_device_count(8);
//   auto mesh = meshrt::make_mesh({4, 2}, {"data", "model"});
//   auto x = meshrt::device_put(host, {8, 4}, meshrt::NamedSharding(mesh, meshrt::P("data")));
//   std::cout << meshrt::visualize_sharding(x);
#pragma once

#include "array.h"
#include "collective_matmul.h"
#include "shard_map.h"
#include "device.h"
#include "dtype.h"
#include "error.h"
#include "mesh.h"
#include "ops.h"
#include "partition_spec.h"
#include "random.h"
#include "sharding.h"
#include "tensor.h"
