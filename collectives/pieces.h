// collectives/pieces.h: where a collective's data lies in its members' buffers, and the placement
// steps every algorithm shares: gathered blocks placed along an axis, a member's block of the sum,
// reductions folded in group-index order, all_to_all's pieces, psum_scatter's chunks staged.
//
// Every step moves memory through the acting member's Plane (host memcpy and reduce loops, or
// its GPU's copies and kernels), so direct, ring and native place data the same way on every
// platform.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/fingerprint.h"
#include "collectives/plane.h"
#include "collectives/reduce.h"
#include "collectives/rendezvous.h"
#include "core/strided.h"

namespace meshrt::coll {

inline bool is_reduction(Kind k) {
  return k == Kind::psum || k == Kind::pmean || k == Kind::pmax || k == Kind::pmin;
}

// The output's dtype: the input's, except pmean of integers (floats).
inline DType out_dtype(const Call& c) {
  return c.kind == Kind::pmean ? pmean_dtype(c.dtype) : c.dtype;
}

inline int64_t count(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Bytes of one member's input.
inline int64_t input_bytes(const Call& c) {
  return count(c.shape) * static_cast<int64_t>(dtype_size(c.dtype));
}

// Member j's buffers, and the plane through which member j moves memory.
inline const char* in_ptr(const Instance& inst, int64_t j) {
  return static_cast<const char*>(inst.slot(j).in);
}
inline char* out_ptr(const Instance& inst, int64_t j) {
  return static_cast<char*>(inst.slot(j).out);
}
// Member j's work buffer: the one it was given, else its output.
inline char* work_of(const Instance& inst, int64_t j) {
  return static_cast<char*>(inst.slot(j).work ? inst.slot(j).work : inst.slot(j).out);
}
inline Plane plane_of(const Instance& inst, int64_t j) {
  return Plane(inst.slot(j).backend, inst.slot(j).device);
}

// Where each member's input lies for the steps below: in its own input buffer, or, given
// `gathered`, in block j of one buffer holding every member's input in group order (what a
// deterministic ring or native collective all-gathers first).
class Inputs {
 public:
  explicit Inputs(const Instance& inst, const char* gathered = nullptr)
      : inst_(inst), gathered_(gathered), block_(gathered ? input_bytes(inst.call()) : 0) {}
  const char* operator()(int64_t j) const {
    return gathered_ ? gathered_ + j * block_ : in_ptr(inst_, j);
  }

 private:
  const Instance& inst_;
  const char* gathered_;
  int64_t block_;
};

// Copies `extent` elements (of `elem` bytes) between two strided views.
void copy_view(const Plane& pl, char* dst, const core::View& dv, const char* src,
               const core::View& sv, const Shape& extent, size_t elem);

// all_gather: places member j's input at position j of member `me`'s output, concatenated along
// the axis (tiled) or stacked in a new dimension there.
void place_gathered(const Instance& inst, int64_t me, const Shape& out_shape, const Inputs& inputs);

// psum_scatter: member `me`'s block of the sum, folded in group-index order.
void fold_own_block(const Instance& inst, int64_t me, const Shape& out_shape, const Inputs& inputs);

// psum/pmean/pmax/pmin: every input folded in group-index order into member `me`'s output
// (direct's bits, whatever the algorithm that brought the inputs).
void fold_inputs(const Instance& inst, int64_t me, const Inputs& inputs);

// Copies member `me`'s input to block `me` of `work` (blocks of the input's size): its own part
// of an all-gather of the inputs.
void stage_own_input(const Instance& inst, int64_t me, char* work);

// psum_scatter's input rearranged chunk-major into `work`: chunk k = member `me`'s block k along
// the scatter dimension, dense. Returns the elements per chunk.
int64_t stage_scatter_chunks(const Instance& inst, int64_t me, char* work);

// all_to_all's pieces: member j sends member i the piece of its input at index i along the
// split axis (a box when tiled, one index when not); i places it at position j along concat.
struct A2APieces {
  A2APieces(const Call& c, const Shape& out_shape, int64_t n);
  // Where the piece for member `to` lies in a sender's input.
  core::View src(int64_t to) const;
  // Where the piece from member `from` goes in a receiver's output.
  core::View dst(int64_t from) const;

  const Call& call;
  const Shape& out;
  Shape extent;
};

}  // namespace meshrt::coll
