// collectives/collective.h: running one device's side of a collective.
//
// start() registers the call at the group's rendezvous and returns at once; finish() waits for
// the peers and moves the data. Blocking collectives are finish(start(...)); the asynchronous
// forms (ppermute_start, all_gather_start) let a body compute in between.
//
// finish() runs the call's algorithm (Call::algo): direct (collectives/direct.h), ring or
// bidi_ring (collectives/ring.h), native (collectives/native.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/fingerprint.h"
#include "collectives/groups.h"
#include "collectives/rendezvous.h"

namespace meshrt::coll {

class Pending {
 public:
  Pending() = default;
  bool valid() const { return inst_ != nullptr; }

 private:
  friend Pending start(Session&, int64_t, const GroupLayout&, const Call&, Slot,
                       std::vector<int64_t>);
  friend void finish(Pending&);
  Session* session_ = nullptr;
  int64_t pos_ = 0;
  int64_t index_ = 0;
  std::shared_ptr<Instance> inst_;
  std::vector<int64_t> out_shape_;
};

// `slot.out` must already hold the output (shape out_shape, dtype of the result).
Pending start(Session& session, int64_t pos, const GroupLayout& layout, const Call& call, Slot slot,
              std::vector<int64_t> out_shape);
// Waits for the peers and fills the output. Throws meshrt::Error on any collective failure.
void finish(Pending& pending);

// Bytes of work buffer a participant must provide in Slot::work for `call` over a group of n
// (0: the output serves, or the algorithm needs none).
int64_t work_bytes(const Call& call, int64_t n);

}  // namespace meshrt::coll
