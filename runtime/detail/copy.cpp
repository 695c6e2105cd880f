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

namespace {

// Where a box copy runs: the backend that moves it and the device index of each side (kHost for
// host memory, including a host-addressable platform's memory seen from another platform).
struct Route {
  backend::Backend* be;
  int sdev, ddev;
};
Route route(const BoxSide& dst, const BoxSide& src) {
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
  return {&be, src_host ? backend::kHost : src.device.local_index(),
          dst_host ? backend::kHost : dst.device.local_index()};
}

// Calls emit(copy) for each 2-D run of the box and counts its bytes.
template <class Emit>
void for_each_copy(const BoxSide& dst, const BoxSide& src, const Shape& extent, size_t elem,
                   const Route& r, Emit&& emit) {
  const core::View dv = core::box_view(dst.shape, dst.start),
                   sv = core::box_view(src.shape, src.start);
  const auto* s = static_cast<const char*>(src.base);
  auto* d = static_cast<char*>(const_cast<void*>(dst.base));
  const auto e = static_cast<int64_t>(elem);
  core::for_each_runs(extent, {&dv, &sv}, [&](const core::Runs& run) {
    emit(backend::DeviceCopy{d + run.offsets[0] * e, r.ddev,
                             static_cast<size_t>(run.pitches[0] * e), s + run.offsets[1] * e,
                             r.sdev, static_cast<size_t>(run.pitches[1] * e),
                             static_cast<size_t>(run.run * e), static_cast<size_t>(run.rows)});
  });
  const int64_t bytes = shape_size(extent) * e;
  const bool local = src.on_host || dst.on_host || src.device == dst.device;
  (local ? copy_stats().local_bytes : copy_stats().cross_device_bytes)
      .fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace

void copy_box(const BoxSide& dst, const BoxSide& src, const Shape& extent, size_t elem) {
  if (shape_size(extent) == 0) return;
  const Route r = route(dst, src);
  for_each_copy(dst, src, extent, elem, r, [&](const backend::DeviceCopy& c) {
    r.be->copy_2d(c.dst, c.dst_device, c.dpitch, c.src, c.src_device, c.spitch, c.width, c.height);
  });
}

CopyBatch::CopyBatch() = default;
CopyBatch::~CopyBatch() = default;

void CopyBatch::add(const BoxSide& dst, const BoxSide& src, const Shape& extent, size_t elem) {
  if (shape_size(extent) == 0) return;
  const Route r = route(dst, src);
  if (r.sdev == backend::kHost || r.ddev == backend::kHost) {
    copy_box(dst, src, extent, elem);
    return;
  }
  if (backend_ != nullptr && backend_ != r.be) flush();
  backend_ = r.be;
  for_each_copy(dst, src, extent, elem, r,
                [&](const backend::DeviceCopy& c) { copies_.push_back(c); });
}

void CopyBatch::flush() {
  if (copies_.empty()) return;
  std::vector<backend::DeviceCopy> copies = std::move(copies_);
  copies_.clear();
  backend_->copy_2d_batch(copies);
}

}  // namespace meshrt::detail
