// runtime/partition_spec.h: how array dimensions map onto mesh axes.
#pragma once

#include <initializer_list>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace meshrt {

// Marks a dimension as not sharded: P("data", None).
struct NoneT {};
// The one NoneT value, JAX's None in a PartitionSpec.
inline constexpr NoneT None{};

// Several mesh axes for one dimension, the first one major: P(Axes{"data", "model"}).
class Axes {
 public:
  // Axes{"data", "model"}: the names, major first.
  Axes(std::initializer_list<std::string> names) : names_(names) {}
  // The same, from a vector of names.
  explicit Axes(std::vector<std::string> names) : names_(std::move(names)) {}
  // The names, major first.
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
};

// One entry per leading array dimension; each entry is a list of mesh axis names (empty =
// not sharded). Canonical as in JAX: Axes{} is None and Axes{"x"} is "x"; trailing Nones are
// kept (P("x", None) has length 2) but shard exactly like P("x").
class PartitionSpec {
 public:
  // The mesh axes of one dimension, major first; empty = not sharded.
  using Entry = std::vector<std::string>;
  // P(): no entries, fully replicated.
  PartitionSpec() = default;
  // From entries in canonical form; P(...) is the usual way to make one.
  explicit PartitionSpec(std::vector<Entry> entries);

  // Number of entries (leading dimensions described), trailing Nones included.
  size_t size() const { return entries_.size(); }
  // Entry d, or an empty (unsharded) entry past the end.
  const Entry& operator[](size_t d) const;
  // All entries, in dimension order.
  const std::vector<Entry>& entries() const { return entries_; }
  // Every axis name used, in order of appearance.
  std::vector<std::string> axes() const;
  // JAX's repr: "P()", "P('x',)", "P('x', None)", "P(('x', 'y'),)".
  std::string str() const;

  // Same entries (P("x") != P("x", None) here, as in JAX; they shard alike).
  friend bool operator==(const PartitionSpec&, const PartitionSpec&) = default;

  // Appends an entry (P() calls these): one axis name, None, or Axes for several axes.
  void add(const char* axis) { entries_.push_back({axis}); }
  // Appends an entry sharded over one axis.
  void add(std::string axis) { entries_.push_back({std::move(axis)}); }
  // Appends an entry sharded over one axis.
  void add(std::string_view axis) { entries_.push_back({std::string(axis)}); }
  // Appends an unsharded entry.
  void add(NoneT) { entries_.emplace_back(); }
  // Appends an entry sharded over several axes, the first major.
  void add(const Axes& axes) { entries_.push_back(axes.names()); }

 private:
  std::vector<Entry> entries_;
};

// Prints str(): "P('x', None)".
inline std::ostream& operator<<(std::ostream& os, const PartitionSpec& s) { return os << s.str(); }

// P() = fully replicated; P("data", None); P(None, "model"); P(Axes{"data", "model"}).
template <class... E>
PartitionSpec P(E&&... entries) {
  PartitionSpec spec;
  (spec.add(std::forward<E>(entries)), ...);
  return spec;
}

}  // namespace meshrt
