// runtime/detail/platform.h: the process-wide platform registry (not installed).
#pragma once

#include <cstdint>

#include "backends/backend.h"
#include "runtime/device.h"

namespace meshrt::detail {

// The backend owning `d`; initialises the platform on first use.
backend::Backend& backend_of(const Device& d);
backend::Backend& backend_of(Device::Kind kind);

// Whether `devices` executors running at once outnumber this machine's cores. Then a device
// that waits (for a peer in a collective) blocks after a short spin instead of spinning on, so it
// never burns a core another device needs. The one answer to this question in the runtime.
bool oversubscribed(int64_t devices);

}  // namespace meshrt::detail
