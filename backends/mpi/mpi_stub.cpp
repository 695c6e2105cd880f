// The MPI backend when meshrt is built without MPI (MESHRT_BUILD_MPI=OFF, or MPI not found).
#include "backends/process_comm.h"
#include "core/error.h"

namespace meshrt::backend {

bool mpi_backend_built() { return false; }

std::unique_ptr<ProcessComm> make_mpi_comm(std::chrono::milliseconds) {
  throw Error(
      "[distributed] this meshrt was built without MPI, so it cannot run as several processes; "
      "install Open MPI (libopenmpi-dev) and rebuild with -DMESHRT_BUILD_MPI=ON (or AUTO)");
}

}  // namespace meshrt::backend
