// backends/plugin.h: platform plugins, loaded on first use (PJRT's plugins, NCCL's net plugins).
//
// The core library links neither CUDA nor MPI: the cuda platform is libmeshrt_cuda.so and the
// process layer under mpirun is libmeshrt_mpi.so, each built with the core when its toolkit is
// found. A plugin is looked for in MESHRT_PLUGIN_DIR when that is set (and only there), else next
// to the core library itself (the build tree, an install prefix, the GPU bundle's lib/), else on
// the loader's search path. It is opened with dlopen the first time its platform is asked for and
// never closed. It exports, with C linkage, `meshrt_plugin_abi` (kPluginAbi below: a plugin built
// against another core is refused) and its entry point.
#pragma once

#include <string>

namespace meshrt::backend {

// Bumped whenever Backend, ProcessComm or NativeComm change shape: a plugin must match its core.
inline constexpr int kPluginAbi = 5;

struct Plugin {
  void* entry = nullptr;  // the entry point's address; null when the plugin is not usable
  std::string path;       // the file opened, or the places looked in
  std::string why;        // why it is not usable ("" when it is)
};

// Opens `file` (e.g. "libmeshrt_cuda.so") and finds `entry` in it. Never throws: a missing file,
// a library the plugin needs that is missing (named), or an ABI mismatch come back in `why`.
// Results are cached per file; thread-safe.
const Plugin& load_plugin(const char* file, const char* entry);
// Whether `p` failed because the plugin file itself is nowhere (not because it could not load).
bool plugin_file_absent(const Plugin& p, const char* file);

}  // namespace meshrt::backend
