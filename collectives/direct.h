// collectives/direct.h: the direct one-shot algorithm, over memory every member can address
// (XLA's CPU collectives). Each member reads its peers' inputs, which the rendezvous keeps alive:
//   psum/pmean/pmax/pmin  small: the last member to arrive reduces once, into its own output on
//                         the host (each other member copies the sum into its own as it leaves,
//                         so the copies run on every core) or into every output on a device;
//                         large: member i reduces slice i from every input and writes it to
//                         every output (coll_fold_to: on the host tile by tile while a tile is
//                         hot, or for large slices line by line with streaming stores; as many
//                         slices as kMinSliceBytes allows); a second barrier ends it;
//   all_gather, psum_scatter, all_to_all, ppermute: each member pulls what it needs, so the
//                         rendezvous is the only barrier.
#pragma once

#include <cstdint>

#include "collectives/plane.h"
#include "collectives/rendezvous.h"

namespace meshrt::coll {

// Inputs up to this many bytes are reduced once, by the last member to arrive.
inline constexpr int64_t kSmallReduceBytes = 32 * 1024;
// Larger host reductions are folded in slices of at least this many input bytes, one per member
// while there are enough (64 MiB on 8 devices: 8 slices; 64 KiB on any group: 4).
inline constexpr int64_t kMinSliceBytes = 16 * 1024;

// Whether the member completing the rendezvous of `call` does all of its work
// (direct_reduce_small) before publishing it.
bool direct_done_at_arrival(const Call& call);
// The small reduction, by the last member to arrive (`me`), through its plane `pl`. On the host
// it folds into `me`'s output and records it in Instance::small_sum_at (direct_collective copies
// it into the other members' outputs); false then. On a device
// platform the work is queued and its token put in `inst` (direct_small_token) rather than
// waited for, where nothing of it outlives the queue (not a pmean that changes dtype, whose sum
// needs a temporary until a fence); true then, and every member orders its later work after the
// token instead of fencing (finish()).
bool direct_reduce_small(Instance& inst, const Plane& pl, int64_t me);
// The token of a small reduction queued without a wait, or null.
void* direct_small_token(const Instance& inst);

// Member `me`'s part of `inst` under direct, once the rendezvous is complete.
void direct_collective(Instance& inst, int64_t me, const Shape& out_shape);

// ppermute in one step (under every algorithm but native): the member's source, else zeros.
void direct_ppermute(const Instance& inst, int64_t me);
// all_to_all by pulls; `pairwise`: step s pulls from member me - s (the schedule the ring family
// uses, each step an exchange between peers at distance s), else in member order.
void direct_all_to_all(const Instance& inst, int64_t me, const Shape& out_shape, bool pairwise);

}  // namespace meshrt::coll
