// The core library's side of the process layer: make_mpi_comm() loads the mpi plugin
// (libmeshrt_mpi.so, backends/plugin.h) the first time a job of several processes starts
// (distributed::initialize under mpirun). No MPI header or library here: a program that never
// runs under mpirun never loads Open MPI.
#include <string>

#include "backends/plugin.h"
#include "backends/process_comm.h"
#include "core/error.h"

namespace meshrt::backend {
namespace {

constexpr const char* kFile = "libmeshrt_mpi.so";

const Plugin& plugin() { return load_plugin(kFile, "meshrt_mpi_comm"); }

}  // namespace

bool mpi_backend_built() { return plugin().entry != nullptr; }

std::unique_ptr<ProcessComm> make_mpi_comm(std::chrono::milliseconds timeout) {
  const Plugin& p = plugin();
  if (p.entry == nullptr) {
#ifndef MESHRT_MPI_PLUGIN_BUILT
    if (plugin_file_absent(p, kFile)) {
      throw Error(
          "[distributed] this meshrt was built without MPI, so it cannot run as several "
          "processes; install Open MPI (libopenmpi-dev) and rebuild with -DMESHRT_BUILD_MPI=ON (or "
          "AUTO)");
    }
#endif
    throw Error(std::string("[distributed] running as several processes needs the mpi plugin ") +
                kFile + ", which could not be loaded: " + p.why + " (looked in: " + p.path +
                "); keep it next to libmeshrt, or set MESHRT_PLUGIN_DIR to its folder");
  }
  auto make = reinterpret_cast<ProcessComm* (*)(long long)>(p.entry);
  return std::unique_ptr<ProcessComm>(make(static_cast<long long>(timeout.count())));
}

}  // namespace meshrt::backend
