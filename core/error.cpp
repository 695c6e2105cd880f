#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace meshrt {

Error::Error(const std::string& what) : std::runtime_error(what) {}

void detail::dcheck_failed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "meshrt: internal invariant failed: %s (%s:%d)\n", condition, file, line);
  std::abort();
}

}  // namespace meshrt
