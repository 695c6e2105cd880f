// core/error.h: the one exception family meshrt throws.
//
// Every message starts with the component in brackets and says what to do, e.g.
//   [sharding] Resource axis: z of P('z',) is not found in mesh: ('x', 'y').
#pragma once

#include <stdexcept>
#include <string>

namespace meshrt {

// Base of every error meshrt throws. Thrown for bad input and for failures of the platform;
// never for internal invariants (those are MESHRT_DCHECKs). An error raised in a shard_map body
// reaches the caller's thread as an Error naming the device ("[shard_map] body on cpu:3
// failed: ..."), with the original nested inside it (std::rethrow_if_nested).
class Error : public std::runtime_error {
 public:
  // `what` is the whole message: "[component] what happened; what to do".
  explicit Error(const std::string& what);
};

namespace detail {
[[noreturn]] void dcheck_failed(const char* condition, const char* file, int line);
}  // namespace detail

}  // namespace meshrt

// Argument checks, always on: throws meshrt::Error(message) when `condition` is false. The
// message starts with the component in brackets and says what to do.
#define MESHRT_CHECK(condition, message)              \
  do {                                                \
    if (!(condition)) throw ::meshrt::Error(message); \
  } while (0)

// Internal invariants: checked in debug builds (aborting with the condition and its place),
// compiled out under NDEBUG.
#ifdef NDEBUG
#define MESHRT_DCHECK(condition) \
  do {                           \
  } while (0)
#else
#define MESHRT_DCHECK(condition)                                                       \
  do {                                                                                 \
    if (!(condition)) ::meshrt::detail::dcheck_failed(#condition, __FILE__, __LINE__); \
  } while (0)
#endif
