// backends/pitched_copy.h: how a pitched copy (cudaMemcpy2D semantics) is issued through a
// platform's 1-D and 2-D copy calls, kept free of vendor headers so cpu tests check it.
//
// Rows contiguous on both sides (or a single row) are one 1-D copy. Otherwise one 2-D copy,
// unless a pitch exceeds `max_pitch` (what the 2-D call accepts: cudaDevAttrMaxPitch, 2^31 - 1 on
// current GPUs); then each row is a 1-D copy, which stays cheap because rows more than
// `max_pitch` bytes apart are few.
#pragma once

#include <cstddef>

namespace meshrt::backend {

// copy1d(dst, src, bytes) and copy2d(dst, dpitch, src, spitch, width, height) return a Status
// whose value-initialised state means success; the first failure is returned.
template <class Status, class Copy1d, class Copy2d>
Status pitched_copy(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t height, size_t max_pitch, Copy1d copy1d, Copy2d copy2d) {
  if (width == 0 || height == 0) return Status{};
  if (height == 1 || (dpitch == width && spitch == width)) return copy1d(dst, src, width * height);
  if (dpitch <= max_pitch && spitch <= max_pitch)
    return copy2d(dst, dpitch, src, spitch, width, height);
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t r = 0; r < height; ++r) {
    const Status st = copy1d(d + r * dpitch, s + r * spitch, width);
    if (st != Status{}) return st;
  }
  return Status{};
}

}  // namespace meshrt::backend
