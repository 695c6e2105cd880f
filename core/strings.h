// runtime/detail/strings.h: small formatting helpers for error messages (not installed).
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace meshrt::detail {

// Concatenates anything streamable.
template <class... A>
std::string cat(const A&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// Python repr of a string: 'x'.
inline std::string quote(std::string_view s) { return cat("'", s, "'"); }

// Python tuple of quoted names: ('x', 'y') or ('x',).
std::string names_tuple(const std::vector<std::string>& names);

// Joins with a separator.
template <class C, class F>
std::string join(const C& items, std::string_view sep, F&& fmt) {
  std::string out;
  bool first = true;
  for (const auto& it : items) {
    if (!first) out += sep;
    first = false;
    out += fmt(it);
  }
  return out;
}

}  // namespace meshrt::detail
