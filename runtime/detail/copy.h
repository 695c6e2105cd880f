// runtime/detail/copy.h: n-d box copies between host memory and device blocks (not installed).
#pragma once

#include <atomic>
#include <cstdint>

#include "core/dtype.h"
#include "runtime/device.h"

namespace meshrt::detail {

// One side of a box copy: a row-major block of `shape` at `base`, on `device` (or host memory
// when on_host).
struct BoxSide {
  const void* base;
  Shape shape;
  Shape start;  // corner of the box inside this block
  Device device;
  bool on_host = false;
};

// Copies the box of `extent` elements (each `elem` bytes) from src to dst. Trailing dimensions
// that are whole on both sides are merged, so a box of full rows is one 2-D copy.
void copy_box(const BoxSide& dst, const BoxSide& src, const Shape& extent, size_t elem);

// Bytes moved by copy_box since start-up, split by whether source and destination are the same
// device (host-side copies count as local). Lets tests check that resharding moves only what
// it must.
struct CopyStats {
  std::atomic<int64_t> local_bytes{0};
  std::atomic<int64_t> cross_device_bytes{0};
};
CopyStats& copy_stats();

}  // namespace meshrt::detail
