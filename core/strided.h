// collectives/strided.h: n-d strided views over flat memory, iterated as contiguous runs.
//
// Used by the collectives' data movement and by the runtime's box copies, so a box (a block of
// an array inside a bigger array) is described and walked one way everywhere.
#pragma once

#include <cstdint>
#include <vector>

namespace meshrt::core {

// A view: element `offset` plus per-dimension strides (in elements) over some base pointer.
struct View {
  int64_t offset = 0;
  std::vector<int64_t> strides;
};

// Row-major strides (in elements) of a dense array of `shape`.
std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape);

// The view of the box starting at `start` inside a dense array of `shape`.
View box_view(const std::vector<int64_t>& shape, const std::vector<int64_t>& start);

// Calls fn(offsets, rows, run) for every group of `rows` runs of `run` contiguous elements that
// together cover `extent` in every view; offsets[i] is view i's element offset of the first run,
// and consecutive rows are pitches[i] elements apart. Trailing dimensions that are contiguous
// in every view are merged, so a whole dense block is one call with rows == 1.
struct Runs {
  std::vector<int64_t> offsets;
  std::vector<int64_t> pitches;
  int64_t rows = 1;
  int64_t run = 1;
};
template <class F>
void for_each_runs(const std::vector<int64_t>& extent, const std::vector<const View*>& views,
                   F&& fn);

}  // namespace meshrt::core

#include "core/strided_inl.h"
