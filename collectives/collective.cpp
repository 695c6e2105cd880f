// One device's side of every collective: the rendezvous, then the call's algorithm, each moving
// memory through a Plane (collectives/plane.h) so the same code serves host and GPU memory.
#include "collectives/collective.h"

#include <mutex>

#include "collectives/cross.h"
#include "collectives/direct.h"
#include "collectives/native.h"
#include "collectives/pieces.h"
#include "collectives/plane.h"
#include "collectives/ring.h"

namespace meshrt::coll {

namespace {

// Instances whose blocks a stream may still write into: kept for the life of the process rather
// than recycled under it.
void keep_forever(std::shared_ptr<Instance> inst) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<Instance>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(inst));
}

// A member leaving finish() with an error may have queued work on its stream that still writes
// into blocks the instance keeps alive (outputs, work buffers), and those are recycled once the
// last member lets the instance go: its stream is fenced first, as on success. Where it cannot be
// (a library call some member never launched), the blocks are never recycled. The first error
// is the one reported.
void settle_after_error(const std::shared_ptr<Instance>& instance, int64_t me) noexcept {
  Instance& inst = *instance;
  const Plane pl = plane_of(inst, me);
  if (pl.host()) return;  // host memory: nothing is left queued
  const bool native = inst.call().algo == Algo::native || inst.spans_processes();
  if (!native || !native_launch_unjoined(inst, me)) {
    try {
      pl.fence();
      return;
    } catch (...) {
    }
  }
  keep_forever(instance);
}

}  // namespace

int64_t work_bytes(const Call& c, int64_t n) {
  if (c.algo == Algo::direct) return 0;
  const int64_t bytes = input_bytes(c);
  if (c.deterministic && (is_reduction(c.kind) || c.kind == Kind::psum_scatter))
    return n * bytes;  // every member's input, gathered
  switch (c.kind) {
    case Kind::pmean:
      return bytes;  // the ring sums in the input dtype
    case Kind::psum_scatter:
      return bytes;
    case Kind::all_gather:
      return c.axis == 0 ? 0 : n * bytes;
    case Kind::all_to_all:
      return c.algo == Algo::native ? 2 * bytes : 0;  // send and receive staging
    default:
      return 0;
  }
}

Pending start(Session& session, int64_t pos, const GroupLayout& layout, const Call& call, Slot slot,
              std::vector<int64_t> out_shape) {
  Pending p;
  p.session_ = &session;
  p.pos_ = pos;
  p.index_ = layout.index_of[static_cast<size_t>(pos)];
  p.out_shape_ = std::move(out_shape);
  const Plane pl(slot.backend, slot.device);
  // The input is complete before any peer may read it. A small direct reduction on a device
  // platform waits on the device instead of the host: the member that folds makes its stream wait
  // for every member's begin token (direct_reduce_small).
  const bool device_begin = !pl.host() && direct_done_at_arrival(call);
  if (device_begin) {
    if (void* t = slot.backend->coll_begin_token(slot.device)) {
      backend::Backend* be = slot.backend;
      const int d = slot.device;
      slot.begin_token =
          std::shared_ptr<void>(t, [be, d](void* token) { be->coll_release_token(d, token); });
    }
  } else {
    pl.begin();
  }
  Session::Arrival a = session.arrive(pos, layout, call, std::move(slot));
  p.inst_ = std::move(a.instance);
  // Across processes the library (not the fold) runs it, after the host wait it expects.
  if (device_begin && p.inst_->spans_processes()) pl.begin();
  if (a.completed) {
    if (p.inst_->spans_processes()) {
      cross_complete(session, *p.inst_, pl);  // members in other processes: the second level
    } else if (direct_done_at_arrival(call) && pl.direct_ok(*p.inst_)) {
      // A group the platform cannot serve with direct is refused in finish(), with the reason.
      (void)direct_reduce_small(*p.inst_, pl, p.index_);
    }
    session.publish(*p.inst_);
  }
  return p;
}

void finish(Pending& p) {
  Instance& inst = *p.inst_;
  const int64_t me = p.index_;
  try {
    p.session_->wait_ready(p.pos_, inst);
    const bool spans = inst.spans_processes();
    if (spans && plane_of(inst, me).host()) {  // every input is here now (collectives/cross.h)
      if (!cross_done_at_arrival(*p.session_, inst))
        cross_finish(*p.session_, inst, me, p.out_shape_);
      p.inst_.reset();
      return;
    }
    // A device platform across processes: its library, over the group's spanning communicators.
    // A small direct reduction queued at arrival: this member's later work waits for it on the
    // device, no host wait (every input was complete at arrival: each member's begin()).
    if (!spans && direct_done_at_arrival(inst.call())) {
      if (void* token = direct_small_token(inst)) {
        plane_of(inst, me).backend()->coll_order_compute(plane_of(inst, me).device(), token);
        p.inst_.reset();
        return;
      }
    }
    const Algo algo = spans ? Algo::native : inst.call().algo;
    // GPUs without peer access cannot run direct or ring: an error, not a fault.
    if (algo != Algo::native) plane_of(inst, me).require_direct(inst);
    switch (algo) {
      case Algo::ring:
      case Algo::bidi_ring:
        ring_collective(*p.session_, p.pos_, inst, me, p.out_shape_);
        break;
      case Algo::native:
        native_collective(*p.session_, p.pos_, inst, me, p.out_shape_);
        break;
      case Algo::automatic:  // never in a Call: choose_algo settles it
      case Algo::direct:
        direct_collective(inst, me, p.out_shape_);
        break;
    }
  } catch (...) {
    settle_after_error(p.inst_, me);
    throw;
  }
  plane_of(inst, me).fence();  // the output is complete, and peers' inputs are no longer read
  p.inst_.reset();
}

}  // namespace meshrt::coll
