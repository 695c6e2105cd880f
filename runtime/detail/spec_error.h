// runtime/detail/spec_error.h: a shard_map error about one in_specs or out_specs entry (not
// installed).
//
// shard_map's checks throw it for an error that names one entry ("in_specs[2] is P('x', 'y')
// which ..."); tree_shard_map catches it, also nested inside a body's error, to add which leaf
// that entry is the spec of, from the entry's list and index rather than the message's text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace meshrt::detail {

enum class SpecList : uint8_t { in, out };  // in_specs, out_specs

class SpecError : public Error {
 public:
  SpecError(SpecList list, size_t index, const std::string& what)
      : Error(what), list_(list), index_(index) {}
  SpecList list() const { return list_; }
  size_t index() const { return index_; }

 private:
  SpecList list_;
  size_t index_;
};

}  // namespace meshrt::detail
