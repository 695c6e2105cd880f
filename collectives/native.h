// collectives/native.h: the platform's collective library (NCCL on cuda) as an algorithm.
//
// It runs after the same rendezvous as every other algorithm, so mismatched or missing calls are
// caught before the library is ever entered. Layout work (chunk staging, placing gathered blocks)
// is shared with the ring forms (collectives/pieces.h); every member confirms its library launch
// on the host before anyone waits on its stream.
#pragma once

#include <cstdint>

#include "collectives/rendezvous.h"

namespace meshrt::coll {

// Member `me`'s part of `inst` (device `pos` of `session`), once the rendezvous is complete.
void native_collective(Session& session, int64_t pos, Instance& inst, int64_t me,
                       const Shape& out_shape);

// Whether member `me` launched its library call while some member never did: its stream then
// holds work that waits for that member forever, so fencing it cannot finish.
bool native_launch_unjoined(Instance& inst, int64_t me);

}  // namespace meshrt::coll
