#include "runtime/detail/copy.h"

#include <vector>

#include "backends/backend.h"
#include "core/error.h"
#include "core/strided.h"
#include "runtime/detail/platform.h"

namespace meshrt::detail {

CopyStats& copy_stats() {
  static CopyStats stats;
  return stats;
}

void copy_box(const BoxSide& dst, const BoxSide& src, const Shape& extent, size_t elem) {
  const int64_t count = shape_size(extent);
  if (count == 0) return;
  // Between platforms (cpu <-> cuda) the host-addressable side is plain host memory to the other
  // platform's backend. A non-host-addressable side (a GPU) does the copy; else whichever side is
  // a device.
  const bool cross = !src.on_host && !dst.on_host && src.device.kind() != dst.device.kind();
  const bool src_host = src.on_host || (cross && backend_of(src.device).host_addressable());
  const bool dst_host = dst.on_host || (cross && backend_of(dst.device).host_addressable());
  if (cross && !src_host && !dst_host) {
    throw Error("[device_put] no copy path between " + src.device.str() + " and " +
                dst.device.str() + "; go through the cpu platform");
  }
  backend::Backend& be = !src_host && !backend_of(src.device).host_addressable()
                             ? backend_of(src.device)
                         : !dst_host ? backend_of(dst.device)
                                     : backend_of(src.device);
  const int sdev = src_host ? backend::kHost : src.device.local_index();
  const int ddev = dst_host ? backend::kHost : dst.device.local_index();
  const core::View dv = core::box_view(dst.shape, dst.start),
                   sv = core::box_view(src.shape, src.start);
  const auto* s = static_cast<const char*>(src.base);
  auto* d = static_cast<char*>(const_cast<void*>(dst.base));
  const auto e = static_cast<int64_t>(elem);
  core::for_each_runs(extent, {&dv, &sv}, [&](const core::Runs& r) {
    be.copy_2d(d + r.offsets[0] * e, ddev, static_cast<size_t>(r.pitches[0] * e),
               s + r.offsets[1] * e, sdev, static_cast<size_t>(r.pitches[1] * e),
               static_cast<size_t>(r.run * e), static_cast<size_t>(r.rows));
  });
  const int64_t bytes = count * e;
  const bool local = src.on_host || dst.on_host || src.device == dst.device;
  (local ? copy_stats().local_bytes : copy_stats().cross_device_bytes)
      .fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace meshrt::detail
