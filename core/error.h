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
  explicit Error(const std::string& what);
};

}  // namespace meshrt
