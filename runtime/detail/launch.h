// runtime/detail/launch.h: one shard_map call, in named steps (not installed).
//
//   check_call        JAX's checks that need no data: nesting, spec count, spec axes
//   place_inputs      each argument resharded to its in_spec: per-device blocks
//   run_bodies        the body once per mesh device, on its executor; failures rethrown
//   assemble_outputs  the result Arrays per out_specs, with the run-time replication check
//
// detail::run_shard_map is these in sequence. run_bodies is the step several processes will
// change (a process runs only its addressable devices), so it takes the placed inputs and
// returns plain per-device blocks, and knows nothing of specs.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/groups.h"
#include "collectives/rendezvous.h"
#include "runtime/array.h"
#include "runtime/context.h"
#include "runtime/mesh.h"
#include "runtime/partition_spec.h"
#include "runtime/shard_map.h"
#include "runtime/tensor.h"

namespace meshrt::detail {

// What the devices of one run share: the mesh, the rendezvous session of their collectives, and
// the device groups of each tuple of axes. Lives while any body, or a PendingTensor one made, does.
struct Launch {
  Launch(Mesh m, std::chrono::milliseconds timeout, bool oversubscribed);
  // The device groups for a tuple of mesh axes (names and their positions in the mesh): built
  // once per process for each mesh shape and axes, and kept (launches reuse them).
  const coll::GroupLayout& layout(const std::vector<std::string>& names,
                                  const std::vector<int>& axes);

  Mesh mesh;
  coll::Session session;
  bool host_addressable;
  coll::Algo env_algo = coll::Algo::automatic;  // MESHRT_COLLECTIVE_ALGO, read once per launch
  bool env_deterministic = false;               // MESHRT_DETERMINISTIC=1

 private:
  std::mutex mu_;
  std::map<std::vector<int>, const coll::GroupLayout*> layouts_;  // guarded by mu_
};

// One device's part of a run, behind its Context: the launch, the device's mesh position, and
// the group layouts its body has used (found again without the launch's lock). Made by
// run_bodies on the device's executor; lives as long as the body. Touched by that body only.
struct BodyState {
  std::shared_ptr<Launch> launch;
  int64_t pos = 0;
  std::vector<const coll::GroupLayout*> layouts;

  Context context() { return Context(*this); }
};

// Throws JAX's errors that need only the specs: shard_map called inside a body, an in_specs
// count that differs from the arguments', a spec naming an axis the mesh lacks or one twice.
void check_call(const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                const std::vector<PartitionSpec>& out_specs, size_t arg_count);

// Step 1. Each argument resharded to NamedSharding(mesh, in_specs[i]), after JAX's checks (same
// platform, rank, divisibility; their messages name options.name). Blocks a device already holds
// are shared, not copied.
std::vector<Array> place_inputs(const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                                const std::vector<Array>& args, const ShardMapOptions& options);

// Step 2. Runs body(ctx, blocks) once per mesh device, concurrently, on the devices' executors;
// `blocks` are the device's blocks of `inputs` (each laid out on `mesh`, as place_inputs gives).
// Returns what each body returned, by mesh position. The first failure (in the order devices
// failed) is rethrown naming its device; the other devices are released (peers waiting for a
// failed device get an error at once), never left hanging. Runs are serialised per process;
// called from the host, never from a body.
std::vector<std::vector<Tensor>> run_bodies(const Mesh& mesh, const ErasedBody& body,
                                            const std::vector<Array>& inputs);

// Step 3. One Array per out_spec from the devices' outputs (by mesh position): checks that each
// device returned one block per out_spec, on its own device, all of one shape and dtype; with
// options.check_replication, that blocks are equal along the mesh axes a spec leaves out.
std::vector<Array> assemble_outputs(const Mesh& mesh, const std::vector<PartitionSpec>& out_specs,
                                    std::vector<std::vector<Tensor>> outputs,
                                    const ShardMapOptions& options);

}  // namespace meshrt::detail
