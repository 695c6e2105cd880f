// Trees: what the templates in tree.h share.
#include "autodiff/tree.h"

namespace meshrt::tree_detail {

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

}  // namespace meshrt::tree_detail
