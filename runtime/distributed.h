// runtime/distributed.h: several processes (multi-host) under mpirun, as JAX's multi-process
// model: every process runs the same program over the global devices (devices(), ordered
// (process, local index)); each holds the shards of its own devices (local_devices()).
//
//   int main() {
//     meshrt::distributed::initialize();  // mpirun -np 2 -x MESHRT_CPU_DEVICES=4 ./prog
//     meshrt::Mesh mesh = meshrt::make_mesh({8}, {"x"});  // spans both processes
//     ...
//   }
//
// Collectives over devices of several processes combine within each process first, then make
// one call per process through the job's communication library (Open MPI, backends/mpi/), then
// fan the result out. Every process must make the same calls in the same order: a mismatch is an
// error on every process naming the processes and calls; a process that dies or stops calling
// is an error on the others within MESHRT_COLLECTIVE_TIMEOUT, and the job ends at exit.
#pragma once

#include <functional>

#include "runtime/array.h"
#include "runtime/sharding.h"
#include "runtime/tensor.h"

namespace meshrt {

namespace distributed {
// Under mpirun with several processes (OMPI_COMM_WORLD_SIZE > 1): starts MPI
// (MPI_THREAD_MULTIPLE), learns every process's devices, and checks that the processes agree on
// what must be equal (platform, collective settings); differences are an Error on every
// process. Otherwise a no-op: one process needs nothing. Call it first in main(), before any
// other meshrt call (an Error after devices were listed); later calls do nothing. Thread-safe.
void initialize();
// Whether initialize() joined several processes.
bool is_initialized();
}  // namespace distributed

// An Array of global shape `global_shape` from each process's local data
// (jax.make_array_from_process_local_data): per dimension, `local` is either the whole global
// extent (every process passes the same values) or the rows of the indices this process's
// devices hold, in increasing order. With one process, device_put(local, sharding).
Array make_array_from_process_local_data(const Sharding& sharding, const Tensor& local,
                                         Shape global_shape);

// An Array of `shape` whose shard for each of this process's devices is callback(its index)
// (jax.make_array_from_callback); the callback runs for local devices only, and returns a
// Tensor of the shard's shape (on any local device: it is copied where it belongs).
Array make_array_from_callback(Shape shape, const Sharding& sharding,
                               std::function<Tensor(const Index&)> callback);

// The whole global value of `x`, on every process (multihost_utils.process_allgather with
// tiled=True), as a Tensor on this process's first device of x's platform. Every process must
// call it. With one process, the value of x on one device.
Tensor process_allgather(const Array& x);

}  // namespace meshrt
