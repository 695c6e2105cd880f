#include "collectives/direct.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <vector>

#include "collectives/pieces.h"
#include "core/threads/wait.h"

namespace meshrt::coll {

namespace {

// Counts member `me`'s part done and waits until every member's is: the writes the others make
// into this member's output are then complete, and nobody reads this member's input any more.
void arrive_and_wait_all(Instance& inst, const Plane& pl) {
  const auto N = static_cast<uint32_t>(inst.size());
  pl.fence();
  std::atomic<uint32_t>& done = inst.phase_counter();
  if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == N) {
    core::wake_all(done);
    return;
  }
  for (uint32_t v; (v = done.load(std::memory_order_acquire)) != N;) {
    core::wait_while(done, v, std::chrono::seconds(1), inst.oversubscribed());
  }
}

// Large reductions: the first `folders` members own a slice each, reduce it and write the result
// to every output (fold_to); then every member waits until every slice has been written. On a GPU
// every member folds (one kernel each). On the host a slice is at least kMinSliceBytes of input: a
// slice per member of a large group would read a few bytes from each of N inputs and write a few to
// each of N outputs (64 KiB over 256 devices: 256 bytes, 512 pages touched per slice), so the cost
// grew faster than N·P; fewer, larger slices do the same additions in the same order per element,
// with a page per input and output per 4 KiB.
int64_t folders_of(const Instance& inst, const Plane& pl) {
  const int64_t N = inst.size();
  if (!pl.host()) return N;
  const int64_t bytes = input_bytes(inst.call());
  return std::clamp<int64_t>((bytes + kMinSliceBytes - 1) / kMinSliceBytes, 1, N);
}

void reduce_large(Instance& inst, int64_t me) {
  const Call& c = inst.call();
  const Plane pl = plane_of(inst, me);
  const int64_t n = count(c.shape), N = inst.size();
  const DType od = out_dtype(c);
  const auto ie = static_cast<int64_t>(dtype_size(c.dtype)),
             oe = static_cast<int64_t>(dtype_size(od));
  const int64_t folders = folders_of(inst, pl);
  const int64_t slice = (n + folders - 1) / folders;
  const int64_t lo = me < folders ? std::min(n, me * slice) : n, hi = std::min(n, lo + slice);
  if (lo < hi) {
    std::vector<const void*> srcs(static_cast<size_t>(N));
    std::vector<void*> dsts(static_cast<size_t>(N));  // this member's output first
    for (int64_t j = 0; j < N; ++j) {
      srcs[static_cast<size_t>(j)] = in_ptr(inst, j) + lo * ie;
      const int64_t k = j == 0 ? me : (j <= me ? j - 1 : j);
      dsts[static_cast<size_t>(j)] = out_ptr(inst, k) + lo * oe;
    }
    // The whole slice in one call. Host: the cpu backend folds it a cache-sized tile at a time
    // and copies each tile to the other outputs while it is in cache, or, for a slice that
    // writes more than the caches hold, streams each line of the result to every output. GPU:
    // one kernel reads the N inputs once and writes the N outputs.
    pl.fold_to(c.kind, c.dtype, od, dsts, srcs, hi - lo);
  }
  arrive_and_wait_all(inst, pl);
}

// A psum_scatter whose scatter dimension has rows before it, seen as (outer, N, run) per input:
// member d's output is (outer, run), out_d[o] = sum over j of in_j[o, d] (tiled or not, the
// memory is the same). The host path for short runs and at least N rows, members in one process.
struct ScatterRows {
  int64_t outer = 0, run = 0;  // in elements
};
std::optional<ScatterRows> scatter_rows_shape(const Instance& inst, const Plane& pl) {
  // Every member must be in this process: each writes into all members' outputs, and all of
  // them arrive at the closing barrier.
  if (!pl.host() || inst.spans_processes()) return std::nullopt;
  const Call& c = inst.call();
  const int64_t N = inst.size();
  const auto sd = static_cast<size_t>(c.axis);
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < sd; ++i) outer *= c.shape[i];
  for (size_t i = sd + 1; i < c.shape.size(); ++i) inner *= c.shape[i];
  const int64_t run = c.shape[sd] / N * inner;
  // Runs of 16 KiB and more stream well enough as fold_own_block reads them.
  if (outer < N || run * static_cast<int64_t>(dtype_size(c.dtype)) >= (int64_t{16} << 10)) {
    return std::nullopt;
  }
  return ScatterRows{outer, run};
}

// Member `me` folds whole rows o in its share of [0, outer): for each o, every member's run,
// read in address order from every input, written to that member's output. Reading only its
// own run of every row instead (fold_own_block) reads pieces far apart: a (8192, 1024) float32
// psum_scatter over dim 1 on 8 members reads 512 bytes every 4 KiB from 8 inputs, 4-6x slower
// than contiguous reads here. Each element is the same sum in the same order (inputs in group
// order), so the bits are fold_own_block's. Then waits for every member: its output is written
// by all of them.
void scatter_by_rows(Instance& inst, int64_t me, const ScatterRows& g) {
  const Call& c = inst.call();
  const int64_t N = inst.size();
  const Plane pl = plane_of(inst, me);
  const auto e = static_cast<int64_t>(dtype_size(c.dtype));
  const int64_t lo = g.outer * me / N, hi = g.outer * (me + 1) / N;
  std::vector<const void*> srcs(static_cast<size_t>(N));
  for (int64_t o = lo; o < hi; ++o) {
    for (int64_t d = 0; d < N; ++d) {
      const int64_t at = (o * N + d) * g.run * e;
      for (int64_t j = 0; j < N; ++j) srcs[static_cast<size_t>(j)] = in_ptr(inst, j) + at;
      pl.fold(Kind::psum, c.dtype, c.dtype, out_ptr(inst, d) + o * g.run * e, srcs, g.run);
    }
  }
  arrive_and_wait_all(inst, pl);
}

}  // namespace

bool direct_done_at_arrival(const Call& call) {
  return call.algo == Algo::direct && is_reduction(call.kind) &&
         input_bytes(call) <= kSmallReduceBytes;
}

void* direct_small_token(const Instance& inst) {
  return inst.small_done_by < 0 ? nullptr
                                : inst.token(inst.small_done_by, Instance::kSmallDoneUnit);
}

bool direct_reduce_small(Instance& inst, const Plane& pl, int64_t me) {
  const Call& c = inst.call();
  const int64_t n = count(c.shape);
  std::vector<const void*> srcs(static_cast<size_t>(inst.size()));
  for (int64_t j = 0; j < inst.size(); ++j) srcs[static_cast<size_t>(j)] = inst.slot(j).in;
  if (pl.host()) {
    // The fold into this member's output only: every other member copies the result into its
    // own as it leaves (direct_collective), so the copies run on every core, not all on this one.
    pl.fold(c.kind, c.dtype, out_dtype(c), out_ptr(inst, me), srcs, n);
    inst.small_sum_at = me;
    return false;
  }
  std::vector<void*> dsts(static_cast<size_t>(inst.size()));
  for (int64_t j = 0; j < inst.size(); ++j) dsts[static_cast<size_t>(j)] = out_ptr(inst, j);
  // Every member's input and output are ready once its begin token is (collective.cpp start()).
  for (int64_t j = 0; j < inst.size(); ++j) {
    if (void* t = inst.slot(j).begin_token.get()) pl.backend()->coll_wait_token(pl.device(), t);
  }
  // One kernel reads every input once and writes every output.
  pl.fold_to(c.kind, c.dtype, out_dtype(c), dsts, srcs, n);
  if (c.kind == Kind::pmean && out_dtype(c) != c.dtype) {
    pl.fence();  // the sum's temporary is released at a fence
    return false;
  }
  inst.put_token(me, Instance::kSmallDoneUnit, pl.backend()->coll_signal(pl.device()));
  inst.small_done_by = me;
  return true;
}

void direct_collective(Instance& inst, int64_t me, const Shape& out_shape) {
  const Call& c = inst.call();
  switch (c.kind) {
    case Kind::psum:
    case Kind::pmean:
    case Kind::pmax:
    case Kind::pmin:
      if (!direct_done_at_arrival(c)) {
        reduce_large(inst, me);
      } else if (inst.small_sum_at >= 0 && inst.small_sum_at != me) {
        const auto bytes = static_cast<size_t>(count(c.shape)) * dtype_size(out_dtype(c));
        plane_of(inst, me).copy(out_ptr(inst, me), out_ptr(inst, inst.small_sum_at), bytes);
        inst.release_buffers(me);  // its input was read before publishing; its output is done
      }
      break;
    case Kind::all_gather:
      place_gathered(inst, me, out_shape, Inputs(inst));
      break;
    case Kind::psum_scatter:
      if (auto rows = scatter_rows_shape(inst, plane_of(inst, me))) {
        scatter_by_rows(inst, me, *rows);
      } else {
        fold_own_block(inst, me, out_shape, Inputs(inst));
      }
      break;
    case Kind::ppermute:
      direct_ppermute(inst, me);
      break;
    case Kind::all_to_all:
      direct_all_to_all(inst, me, out_shape, /*pairwise=*/false);
      break;
  }
}

void direct_ppermute(const Instance& inst, int64_t me) {
  const Call& c = inst.call();
  const Plane pl = plane_of(inst, me);
  const auto bytes = static_cast<size_t>(input_bytes(c));
  for (auto [s, d] : c.perm) {
    if (d == me) {
      pl.copy(out_ptr(inst, me), in_ptr(inst, s), bytes);
      return;
    }
  }
  pl.zero(out_ptr(inst, me), bytes);  // nothing arrives here: zeros, as in JAX
}

void direct_all_to_all(const Instance& inst, int64_t me, const Shape& out_shape, bool pairwise) {
  const Call& c = inst.call();
  const int64_t N = inst.size();
  const A2APieces pieces(c, out_shape, N);
  const core::View src = pieces.src(me);
  for (int64_t step = 0; step < N; ++step) {
    const int64_t j = pairwise ? ((me - step) % N + N) % N : step;
    copy_view(plane_of(inst, me), out_ptr(inst, me), pieces.dst(j), in_ptr(inst, j), src,
              pieces.extent, dtype_size(c.dtype));
  }
}

}  // namespace meshrt::coll
