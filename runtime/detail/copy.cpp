#include "runtime/detail/copy.h"

#include <vector>

#include "backends/backend.h"
#include "runtime/detail/platform.h"

namespace meshrt::detail {

CopyStats& copy_stats() {
  static CopyStats stats;
  return stats;
}

void copy_box(const BoxSide& dst, const BoxSide& src, const Shape& extent, size_t elem) {
  const size_t rank = extent.size();
  int64_t count = shape_size(extent);
  if (count == 0) return;
  // Dimensions from innermost out: (extent, src stride, dst stride) in bytes.
  struct Dim { int64_t n; int64_t ss; int64_t ds; };
  std::vector<Dim> dims;
  int64_t ss = static_cast<int64_t>(elem), ds = static_cast<int64_t>(elem);
  int64_t src_off = 0, dst_off = 0;
  for (size_t i = rank; i-- > 0;) {
    src_off += src.start[i] * ss;
    dst_off += dst.start[i] * ds;
    if (extent[i] != 1) dims.push_back({extent[i], ss, ds});
    ss *= src.shape[i];
    ds *= dst.shape[i];
  }
  // Contiguous run: element size, grown while the next dimension continues it on both sides.
  int64_t run = static_cast<int64_t>(elem);
  size_t k = 0;
  while (k < dims.size() && dims[k].ss == run && dims[k].ds == run) run *= dims[k++].n;
  int64_t rows = 1, spitch = run, dpitch = run;
  if (k < dims.size()) {
    rows = dims[k].n;
    spitch = dims[k].ss;
    dpitch = dims[k].ds;
    ++k;
  }
  backend::Backend& be =
      !src.on_host && !backend_of(src.device).host_addressable() ? backend_of(src.device)
      : !dst.on_host ? backend_of(dst.device)
                     : backend_of(src.device);
  const int sdev = src.on_host ? backend::kHost : src.device.local_index();
  const int ddev = dst.on_host ? backend::kHost : dst.device.local_index();
  // Remaining outer dimensions: odometer over their indices.
  std::vector<int64_t> idx(dims.size() - k, 0);
  const auto* s = static_cast<const char*>(src.base);
  auto* d = static_cast<char*>(const_cast<void*>(dst.base));
  for (;;) {
    int64_t so = src_off, doff = dst_off;
    for (size_t j = 0; j < idx.size(); ++j) {
      so += idx[j] * dims[k + j].ss;
      doff += idx[j] * dims[k + j].ds;
    }
    be.copy_2d(d + doff, ddev, static_cast<size_t>(dpitch), s + so, sdev,
               static_cast<size_t>(spitch), static_cast<size_t>(run), static_cast<size_t>(rows));
    size_t j = 0;
    for (; j < idx.size(); ++j) {
      if (++idx[j] < dims[k + j].n) break;
      idx[j] = 0;
    }
    if (j == idx.size()) break;
  }
  const int64_t bytes = count * static_cast<int64_t>(elem);
  const bool local = src.on_host || dst.on_host || src.device == dst.device;
  (local ? copy_stats().local_bytes : copy_stats().cross_device_bytes)
      .fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace meshrt::detail
