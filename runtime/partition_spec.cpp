#include "runtime/partition_spec.h"

#include "core/strings.h"

namespace meshrt {

PartitionSpec::PartitionSpec(std::vector<Entry> entries) : entries_(std::move(entries)) {}

const PartitionSpec::Entry& PartitionSpec::operator[](size_t d) const {
  static const Entry kEmpty;
  return d < entries_.size() ? entries_[d] : kEmpty;
}

std::vector<std::string> PartitionSpec::axes() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.insert(out.end(), e.begin(), e.end());
  return out;
}

std::string PartitionSpec::str() const {
  std::string s = "P(";
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (i) s += ", ";
    const Entry& e = entries_[i];
    if (e.empty()) {
      s += "None";
    } else if (e.size() == 1) {
      s += detail::quote(e[0]);
    } else {
      s += detail::names_tuple(e);
    }
  }
  if (entries_.size() == 1) s += ",";
  return s + ")";
}

}  // namespace meshrt
