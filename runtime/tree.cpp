// Trees: what the templates in tree.h share (names, error messages).
#include "runtime/tree.h"

#include <cxxabi.h>

#include <cstdlib>
#include <exception>
#include <memory>

#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/detail/spec_error.h"

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
  if (detail::ArrayAccess::blocks(x).empty()) {
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
// The SpecError `e` is, or holds nested (a body's error wraps the body's own), if any.
const detail::SpecError* spec_error_in(const std::exception& e) {
  if (const auto* s = dynamic_cast<const detail::SpecError*>(&e)) return s;
  try {
    std::rethrow_if_nested(e);
  } catch (const std::exception& inner) {
    return spec_error_in(inner);  // lives as long as `e`, which holds it
  } catch (...) {
  }
  return nullptr;
}
}  // namespace

void rethrow_with_spec_paths(const std::vector<std::string>& in_paths,
                             const std::vector<std::string>& out_paths) {
  try {
    throw;
  } catch (const Error& e) {
    const detail::SpecError* s = spec_error_in(e);
    if (s == nullptr) throw;
    const bool in = s->list() == detail::SpecList::in;
    const std::vector<std::string>& paths = in ? in_paths : out_paths;
    if (s->index() >= paths.size()) throw;
    std::throw_with_nested(Error(cat(e.what(), " (", in ? "in_specs" : "out_specs", "[", s->index(),
                                     "] is the spec of ", paths[s->index()], ")")));
  }
}

}  // namespace meshrt::tree_detail
