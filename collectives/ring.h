// collectives/ring.h: the ring and bidirectional-ring algorithms. run_ring is written against
// Transport only, so one ring serves every backend.
//
// Every member's work buffer holds the N chunks of a flat array, chunk k = elements
// [k*C, (k+1)*C) (the last may be shorter for all-reduce). A ring with direction d = +1 or -1
// has left neighbour me - d. Reduce-scatter step s (0..N-2) folds left's chunk me - d*(2+s) into
// the same chunk of mine, so member `me` ends owning chunk `me`, reduced in ring order starting at
// member me + d: ((x[me+d] op x[me+2d]) op ...) op x[me]. All-gather step t (0..N-2) copies
// left's chunk me - d*(1+t). Chunks are processed in pieces, each with its own progress unit, so
// a member works on piece p while its neighbour still sends piece p+1 (pipelining).
// Bidirectional: the data is split in two halves travelling in opposite directions.
//
// ring_collective runs it over the members' buffers in a rendezvous instance: work buffers hold
// flat chunk-major data, and local copies before and after arrange it from and into the
// collective's layout.
#pragma once

#include <cstdint>

#include "collectives/rendezvous.h"
#include "collectives/transport.h"

namespace meshrt::coll {

enum class RingPhase { reduce_scatter, all_gather, all_reduce };

// Runs `phase` for member `me` of `n` on elements [0, count) of the work buffers (elem bytes each).
// The work buffer must already hold: the member's input (reduce_scatter, all_reduce) or its own
// chunk `me` (all_gather). Units 1.. of the member's progress counter are used from `unit0`.
// Returns the next free unit.
// `piece_bytes` is the pipelining granularity (host memory: a few hundred KiB that stay in cache;
// GPUs: MiBs, so few enough steps are queued).
uint32_t run_ring(Transport& t, RingPhase phase, Kind op, DType dtype, int64_t me, int64_t n,
                  int64_t count, bool bidirectional, uint32_t unit0, int64_t piece_bytes);

// Member `me`'s part of `inst` under ring or bidi_ring, once the rendezvous is complete (device
// `pos` of `session`): reductions, all_gather and psum_scatter over the ring (deterministic
// reductions all-gather the inputs over it, then fold them in group-index order, as direct
// does); all_to_all by direct's pulls in the pairwise schedule; ppermute in one step.
void ring_collective(Session& session, int64_t pos, Instance& inst, int64_t me,
                     const Shape& out_shape);

}  // namespace meshrt::coll
