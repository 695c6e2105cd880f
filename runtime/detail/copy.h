// runtime/detail/copy.h: n-d box copies between host memory and device blocks (not installed).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "runtime/device.h"

namespace meshrt::backend {
class Backend;
struct DeviceCopy;
}  // namespace meshrt::backend

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

// Box copies collected and issued together: copies between two devices of one platform wait
// for flush(), which hands them to the backend as one batch (Backend::copy_2d_batch: cuda orders
// them once and moves them in one launch instead of one copy and two stream waits each; cpu
// splits them across the cores, however small each one is); a copy from or to host memory runs
// at once, as copy_box. No added copy's destination may overlap another's source or destination
// (a resharding's fresh blocks).
class CopyBatch {
 public:
  CopyBatch();
  CopyBatch(const CopyBatch&) = delete;
  CopyBatch& operator=(const CopyBatch&) = delete;
  ~CopyBatch();  // copies never flushed are dropped (an error unwound past them)
  void add(const BoxSide& dst, const BoxSide& src, const Shape& extent, size_t elem);
  // Issues the batched copies; their destinations are ready for any later use after it.
  void flush();

 private:
  backend::Backend* backend_ = nullptr;
  std::vector<backend::DeviceCopy> copies_;
};

// Bytes moved by copy_box since start-up, split by whether source and destination are the same
// device (host-side copies count as local). Lets tests check that resharding moves only what
// it must.
struct CopyStats {
  std::atomic<int64_t> local_bytes{0};
  std::atomic<int64_t> cross_device_bytes{0};
};
CopyStats& copy_stats();

}  // namespace meshrt::detail
