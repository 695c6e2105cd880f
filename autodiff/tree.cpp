// Trees: what the templates in tree.h share (names, error messages).
#include "autodiff/tree.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "core/strings.h"

namespace meshrt::tree_detail {

using detail::cat;

std::vector<std::string> split_field_names(std::string_view list) {
  std::vector<std::string> names(1);
  for (char c : list) {
    if (c == ',') {
      names.emplace_back();
    } else if (c != ' ' && c != '\t' && c != '\n') {
      names.back() += c;
    }
  }
  return names;
}

std::string type_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  std::string name = status == 0 && demangled ? demangled.get() : type.name();
  // Users write these names unqualified.
  for (std::string_view scope : {"meshrt::", "std::__cxx11::"}) {
    for (size_t at = name.find(scope); at != std::string::npos; at = name.find(scope, at)) {
      name.erase(at, scope.size());
    }
  }
  return name;
}

std::string describe_keys(const std::vector<std::string>& keys) {
  if (keys.empty()) return "(none)";
  return detail::join(keys, ", ", [](const std::string& k) { return detail::quote(k); });
}

namespace {
std::string role(const Walk& w, size_t k) {
  if (k < w.roles.size()) return w.roles[k];
  static const char* const kOrdinals[] = {"first", "second", "third", "fourth", "fifth"};
  if (k < 5) return cat("the ", kOrdinals[k], " tree");
  return cat("tree ", k + 1);
}
std::string head(const Walk& w) { return cat("[", w.component, "] ", w.api, ": "); }
}  // namespace

void throw_error(const Walk& w, const std::string& what) { throw Error(head(w) + what); }

void throw_mismatch(const Walk& w, const std::string& path, size_t k, const std::string& first,
                    const std::string& other) {
  throw Error(cat(head(w), "structure mismatch at ", path, ": ", first, " in ", role(w, 0), ", ",
                  other, " in ", role(w, k)));
}

void throw_missing_field(const Walk& w, const std::string& path, size_t k,
                         const std::string& other_type, std::string_view field) {
  throw Error(cat(head(w), "structure mismatch at ", path, ": ", role(w, k), " (", other_type,
                  ") has no field ", detail::quote(field), "; give it one, with the field's name"));
}

void check_leaf_set(const Walk& w, const std::string& path, const Array& x) {
  if (x.blocks().empty()) {
    throw Error(cat(head(w), path,
                    " is an empty Array (default-constructed, never set); set it before use"));
  }
}
void check_leaf_set(const Walk& w, const std::string& path, const Tensor& x) {
  if (!x.valid()) {
    throw Error(cat(head(w), path,
                    " is an empty Tensor (default-constructed, never set); set it before use"));
  }
}

void throw_not_sharding(const Walk& w, const std::string& path, const std::string& what) {
  throw Error(cat(head(w), role(w, 1), " hold ", what, " at ", path,
                  "; a Sharding (NamedSharding, SingleDeviceSharding) or a Device is required"));
}

void rethrow_at(const Walk& w, const std::string& path) {
  try {
    throw;
  } catch (const Error& e) {
    std::throw_with_nested(Error(cat(head(w), "at ", path, ": ", e.what())));
  }
}

namespace {
// " (in_specs[2] is the spec of args[1].w)" for the first "in_specs[2]" in `msg`, else "".
std::string spec_note(const std::string& msg, std::string_view list,
                      const std::vector<std::string>& paths) {
  const std::string key = cat(list, "[");
  for (size_t at = msg.find(key); at != std::string::npos; at = msg.find(key, at + 1)) {
    if (at > 0 && list == "in_specs" && msg[at - 1] == 't') continue;  // "out_specs["
    size_t digits = at + key.size(), end = digits;
    while (end < msg.size() && msg[end] >= '0' && msg[end] <= '9') ++end;
    if (end == digits || end >= msg.size() || msg[end] != ']') continue;
    size_t k = std::stoul(msg.substr(digits, end - digits));
    if (k < paths.size()) return cat(" (", list, "[", k, "] is the spec of ", paths[k], ")");
  }
  return "";
}
}  // namespace

void rethrow_with_spec_paths(const std::vector<std::string>& in_paths,
                             const std::vector<std::string>& out_paths) {
  try {
    throw;
  } catch (const Error& e) {
    const std::string msg = e.what();
    const std::string note =
        spec_note(msg, "in_specs", in_paths) + spec_note(msg, "out_specs", out_paths);
    if (note.empty()) throw;
    std::throw_with_nested(Error(msg + note));
  }
}

}  // namespace meshrt::tree_detail
