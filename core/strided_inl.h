// Implementation of for_each_runs (template).
#pragma once

#include <cstddef>

namespace meshrt::core {

template <class F>
void for_each_runs(const std::vector<int64_t>& extent, const std::vector<const View*>& views,
                   F&& fn) {
  const size_t nv = views.size();
  for (int64_t e : extent) {
    if (e == 0) return;
  }
  // Dimensions innermost first, skipping extent-1 dimensions (they only move the offset).
  struct Dim {
    int64_t n;
    std::vector<int64_t> stride;
  };
  std::vector<Dim> dims;
  for (size_t d = extent.size(); d-- > 0;) {
    if (extent[d] == 1) continue;
    Dim dim{extent[d], {}};
    for (const View* v : views) dim.stride.push_back(v->strides[d]);
    dims.push_back(std::move(dim));
  }
  int64_t run = 1;
  size_t k = 0;
  auto contiguous = [&](const Dim& dim) {
    for (size_t i = 0; i < nv; ++i) {
      if (dim.stride[i] != run) return false;
    }
    return true;
  };
  while (k < dims.size() && contiguous(dims[k])) run *= dims[k++].n;
  Runs r;
  r.run = run;
  r.pitches.assign(nv, run);
  if (k < dims.size()) {
    r.rows = dims[k].n;
    r.pitches = dims[k].stride;
    ++k;
  }
  std::vector<int64_t> idx(dims.size() - k, 0);
  r.offsets.resize(nv);
  for (;;) {
    for (size_t i = 0; i < nv; ++i) {
      int64_t o = views[i]->offset;
      for (size_t j = 0; j < idx.size(); ++j) o += idx[j] * dims[k + j].stride[i];
      r.offsets[i] = o;
    }
    fn(static_cast<const Runs&>(r));
    size_t j = 0;
    for (; j < idx.size(); ++j) {
      if (++idx[j] < dims[k + j].n) break;
      idx[j] = 0;
    }
    if (j == idx.size()) return;
  }
}

}  // namespace meshrt::core
