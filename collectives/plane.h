// collectives/plane.h: how one member of a collective touches memory.
//
// On a host-addressable platform (cpu) the collectives read and write peers' buffers directly
// (memcpy, the reduce loops of collectives/reduce.h): no indirection on the latency path. On a
// device platform (cuda) the same algorithms queue the same steps through the backend's
// collective primitives (device copies and reduction kernels on the member's communication
// stream) and fence before they tell a peer or the host that data is there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/backend.h"
#include "collectives/fingerprint.h"

namespace meshrt::coll {

class Plane {
 public:
  Plane() = default;  // host memory
  Plane(backend::Backend* device_backend, int device) : be_(device_backend), device_(device) {}
  bool host() const { return be_ == nullptr; }
  backend::Backend* backend() const { return be_; }
  int device() const { return device_; }

  // The member's earlier work is complete (before it joins a collective).
  void begin() const {
    if (be_) be_->coll_begin(device_);
  }
  void copy(void* dst, const void* src, size_t bytes) const;
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
               size_t height) const;
  void zero(void* dst, size_t bytes) const;
  // dst[e] = fold of srcs[*][e] in srcs order; pmean divides by srcs.size() into `out`.
  void fold(Kind op, DType in, DType out, void* dst, const std::vector<const void*>& srcs,
            int64_t len) const;
  // `rows` rows of fold(op, srcs) (psum/pmax/pmin, dtype in = out): row r of dst at r*dpitch
  // elements, of every source at r*spitch.
  void fold_rows(Kind op, DType dtype, void* dst, int64_t dpitch,
                 const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                 int64_t rows) const;
  void mean_from_sum(DType in, DType out, void* dst, const void* sum, int64_t len,
                     int64_t divisor) const;
  // Everything queued so far is done and visible to peers and the host.
  void fence() const {
    if (be_) be_->coll_fence(device_);
  }

 private:
  backend::Backend* be_ = nullptr;
  int device_ = -1;
};

backend::FoldOp fold_op(Kind k);

}  // namespace meshrt::coll
