// collectives/plane.h: how one member of a collective touches memory: through its backend's
// collective primitives (backends/backend.h), so one algorithm serves every platform.
//
// On a host-addressable platform (cpu) the primitives are the cpu backend's memcpy and fold loops
// (backends/cpu/coll_primitives.h); they complete when they return, so the ordering steps (begin,
// fence, progress tokens) are skipped here without a call. On a device platform (cuda) the same
// steps are queued on the member's communication stream, and the algorithm fences before it
// tells a peer or the host that data is there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "collectives/fingerprint.h"

namespace meshrt::backend {
class NativeComm;
}

namespace meshrt::coll {

class Instance;

inline backend::FoldOp fold_op(Kind k) {
  switch (k) {
    case Kind::pmax:
      return backend::FoldOp::max;
    case Kind::pmin:
      return backend::FoldOp::min;
    case Kind::pmean:
      return backend::FoldOp::mean;
    default:
      return backend::FoldOp::sum;
  }
}

class Plane {
 public:
  // `backend` (never null) owns `device`'s memory; it outlives the plane.
  Plane(backend::Backend* backend, int device) : be_(backend), device_(device) {}
  // Host memory: primitives are done when they return.
  bool host() const { return be_->host_addressable(); }
  backend::Backend* backend() const { return be_; }
  int device() const { return device_; }

  // The member's earlier work is complete (before it joins a collective).
  void begin() const {
    if (!host()) be_->coll_begin(device_);
  }
  void copy(void* dst, const void* src, size_t bytes) const {
    if (bytes != 0) be_->coll_copy_2d(device_, dst, bytes, src, bytes, bytes, 1);
  }
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
               size_t height) const {
    if (width != 0 && height != 0)
      be_->coll_copy_2d(device_, dst, dpitch, src, spitch, width, height);
  }
  void zero(void* dst, size_t bytes) const {
    if (bytes != 0) be_->coll_zero(device_, dst, bytes);
  }
  // dst[e] = fold of srcs[*][e] in srcs order; pmean divides by srcs.size() into `out`.
  void fold(Kind op, DType in, DType out, void* dst, const std::vector<const void*>& srcs,
            int64_t len) const {
    if (len != 0) be_->coll_fold(device_, fold_op(op), in, out, dst, srcs, len);
  }
  // fold(op, srcs) written to every one of `dsts` (the same bits in each).
  void fold_to(Kind op, DType in, DType out, const std::vector<void*>& dsts,
               const std::vector<const void*>& srcs, int64_t len) const {
    if (len != 0 && !dsts.empty())
      be_->coll_fold_to(device_, fold_op(op), in, out, dsts, srcs, len);
  }
  // `rows` rows of fold(op, srcs) (psum/pmax/pmin, dtype in = out): row r of dst at r*dpitch
  // elements, of every source at r*spitch.
  void fold_rows(Kind op, DType dtype, void* dst, int64_t dpitch,
                 const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                 int64_t rows) const {
    if (len != 0 && rows != 0)
      be_->coll_fold_rows(device_, fold_op(op), dtype, dst, dpitch, srcs, spitch, len, rows);
  }
  void mean_from_sum(DType in, DType out, void* dst, const void* sum, int64_t len,
                     int64_t divisor) const {
    if (len != 0) be_->coll_mean(device_, in, out, dst, sum, len, divisor);
  }
  // Everything queued so far is done and visible to peers and the host.
  void fence() const {
    if (!host()) be_->coll_fence(device_);
  }

  // Whether `inst`'s members can run the direct and ring algorithms (cuda: their GPUs reach
  // each other's memory); require_direct throws the reason, naming the call, when they cannot.
  bool direct_ok(const Instance& inst) const { return host() || direct_reason(inst).empty(); }
  void require_direct(const Instance& inst) const {
    if (!host()) require_direct_slow(inst);
  }
  // The platform's vendor collective library; throws when there is none.
  backend::NativeComm& native_comm() const;

 private:
  std::string direct_reason(const Instance& inst) const;
  void require_direct_slow(const Instance& inst) const;

  backend::Backend* be_;
  int device_;
};

}  // namespace meshrt::coll
