// backends/merge_dims.h: collapses an elementwise iteration space before a kernel launch.
//
// Output elements are visited in row-major order of `shape`; operand i's element for output
// index (i_0, ..., i_r) is at sum_d i_d * strides[i][d]. Dimensions of size 1 are dropped, and
// neighbours d, d+1 merge when every operand has strides[d] == strides[d+1] * shape[d+1]
// (contiguous together, or both broadcast), so the visited offsets stay the same while the rank
// shrinks (a dense or broadcast operand becomes one or two dimensions).
#pragma once

#include <cstdint>
#include <vector>

namespace meshrt::backend {

struct MergedDims {
  std::vector<int64_t> size;                  // rank 0: one element (or shape had a 0: nothing)
  std::vector<std::vector<int64_t>> strides;  // per operand, one per merged dimension
};

inline MergedDims merge_dims(const std::vector<int64_t>& shape,
                             const std::vector<const std::vector<int64_t>*>& strides) {
  MergedDims m;
  m.strides.resize(strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !m.size.empty();
    for (size_t i = 0; merge && i < strides.size(); ++i)
      merge = m.strides[i].back() == (*strides[i])[d] * shape[d];
    if (merge) {
      m.size.back() *= shape[d];
      for (size_t i = 0; i < strides.size(); ++i) m.strides[i].back() = (*strides[i])[d];
    } else {
      m.size.push_back(shape[d]);
      for (size_t i = 0; i < strides.size(); ++i) m.strides[i].push_back((*strides[i])[d]);
    }
  }
  return m;
}

}  // namespace meshrt::backend
