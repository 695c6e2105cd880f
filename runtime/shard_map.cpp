// shard_map: JAX's checks, then the launch's steps in order (runtime/detail/launch.h).
#include "runtime/shard_map.h"

#include "runtime/detail/launch.h"

namespace meshrt {

std::vector<Array> detail::run_shard_map(const ErasedBody& body, const Mesh& mesh,
                                         const std::vector<PartitionSpec>& in_specs,
                                         const std::vector<PartitionSpec>& out_specs,
                                         const std::vector<Array>& args,
                                         const ShardMapOptions& options) {
  check_call(mesh, in_specs, out_specs, args.size());
  std::vector<Array> inputs = place_inputs(mesh, in_specs, args);
  std::vector<std::vector<Tensor>> outputs = run_bodies(mesh, body, inputs);
  return assemble_outputs(mesh, out_specs, std::move(outputs), options);
}

}  // namespace meshrt
