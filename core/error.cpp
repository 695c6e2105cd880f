#include "core/error.h"

namespace meshrt {
Error::Error(const std::string& what) : std::runtime_error(what) {}
}  // namespace meshrt
