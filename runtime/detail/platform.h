// runtime/detail/platform.h: the process-wide platform registry (not installed).
#pragma once

#include "backends/backend.h"
#include "runtime/device.h"

namespace meshrt::detail {

// The backend owning `d`; initialises the platform on first use.
backend::Backend& backend_of(const Device& d);
backend::Backend& backend_of(Device::Kind kind);

}  // namespace meshrt::detail
