// runtime/detail/platform.h: the process-wide platform registry (not installed).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "runtime/device.h"

namespace meshrt::detail {

// The backend owning `d`; initialises the platform on first use.
backend::Backend& backend_of(const Device& d);
backend::Backend& backend_of(Device::Kind kind);

// Tests: makes `b` the cuda platform's backend (a stand-in with queued, lazily run kernels proves
// what device platforms rely on without a GPU). Before the platform's first use only, else an
// Error; `kind` must be cuda.
void install_backend_for_testing(Device::Kind kind, std::unique_ptr<backend::Backend> b);

// Whether `devices` executors running at once outnumber this machine's cores. Then a device
// that waits (for a peer in a collective) blocks after a short spin instead of spinning on, so it
// never burns a core another device needs. The one answer to this question in the runtime.
bool oversubscribed(int64_t devices);

// The job's processes and their device counts (distributed::initialize; one process otherwise).
struct ProcessLayout {
  int rank = 0;
  int size = 1;
  std::vector<int> cpu_counts;   // per process; empty: this process's count
  std::vector<int> cuda_counts;  // per process; empty: this process's count
};
// Installs it before any device list is built; an Error once devices() has been used.
void set_process_layout(ProcessLayout layout);
const ProcessLayout& process_layout();
// This process's device counts, as devices() will list them (starts the platforms).
int local_device_count(Device::Kind kind);
// Whether `d` belongs to this process (holds data here).
inline bool is_local(const Device& d) { return d.process_index() == process_layout().rank; }

}  // namespace meshrt::detail
