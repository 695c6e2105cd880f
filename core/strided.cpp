#include "core/strided.h"

namespace meshrt::core {

std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    s[d] = acc;
    acc *= shape[d];
  }
  return s;
}

View box_view(const std::vector<int64_t>& shape, const std::vector<int64_t>& start) {
  View v{0, dense_strides(shape)};
  for (size_t d = 0; d < shape.size(); ++d) v.offset += start[d] * v.strides[d];
  return v;
}

}  // namespace meshrt::core
