#include "collectives/ring.h"

#include <algorithm>

#include "collectives/direct.h"
#include "collectives/pieces.h"

namespace meshrt::coll {

namespace {

inline int64_t mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

}  // namespace

uint32_t run_ring(Transport& t, RingPhase phase, Kind op, DType dtype, int64_t me, int64_t n,
                  int64_t count, bool bidirectional, uint32_t unit0, int64_t piece_bytes) {
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  // Unit unit0 = "my work buffer is initialised": a neighbour may read it from then on.
  t.signal(me, unit0);
  if (n == 1 || count == 0) return unit0 + 1;
  const int64_t halves = bidirectional ? 2 : 1;
  const int64_t steps = (phase == RingPhase::all_reduce ? 2 : 1) * (n - 1);
  // Elements of chunk k that ring h (direction +1 for h = 0, -1 for h = 1) carries, as [lo, hi).
  // all_reduce splits the array in halves, each cut into n chunks; the others cut the array in
  // n equal chunks and send half of each chunk each way.
  auto span = [&](int64_t h, int64_t k, int64_t& lo, int64_t& hi) {
    if (phase == RingPhase::all_reduce) {
      const int64_t half = (count + halves - 1) / halves;
      const int64_t base = std::min(h * half, count), len = std::min(count, (h + 1) * half) - base;
      const int64_t chunk = (len + n - 1) / n;
      lo = base + std::min(k * chunk, len);
      hi = base + std::min((k + 1) * chunk, len);
    } else {
      const int64_t c = count / n, half = (c + halves - 1) / halves;
      lo = k * c + std::min(h * half, c);
      hi = k * c + std::min((h + 1) * half, c);
    }
  };
  // Pieces per chunk: enough to pipeline, the same for every ring so units line up.
  int64_t max_span = 0;
  for (int64_t h = 0; h < halves; ++h) {
    int64_t lo, hi;
    span(h, 0, lo, hi);
    max_span = std::max(max_span, hi - lo);
  }
  const int64_t pieces = std::max<int64_t>(1, (max_span * elem + piece_bytes - 1) / piece_bytes);
  // unit(s, p) completed => progress >= unit0 + 1 + s * pieces + p.
  for (int64_t s = 0; s < steps; ++s) {
    const bool rs =
        phase == RingPhase::reduce_scatter || (phase == RingPhase::all_reduce && s < n - 1);
    const int64_t st = rs ? s : (phase == RingPhase::all_reduce ? s - (n - 1) : s);
    for (int64_t p = 0; p < pieces; ++p) {
      const uint32_t done = unit0 + 1 + static_cast<uint32_t>(s * pieces + p);
      for (int64_t h = 0; h < halves; ++h) {
        const int64_t d = h == 0 ? 1 : -1;
        const int64_t left = mod(me - d, n);
        // Left must have completed the same piece of the previous step (or initialised).
        t.wait(left, s == 0 ? unit0 : done - static_cast<uint32_t>(pieces));
        const int64_t k = rs ? mod(me - d * (2 + st), n) : mod(me - d * (1 + st), n);
        int64_t lo, hi;
        span(h, k, lo, hi);
        const int64_t w = (hi - lo + pieces - 1) / pieces;
        const int64_t a = std::min(hi, lo + p * w), b = std::min(hi, a + w);
        if (b <= a) continue;
        if (rs) {
          t.reduce(op, dtype, me, Buf::work, a, left, Buf::work, a, b - a);
        } else {
          t.copy(me, Buf::work, a * elem, left, Buf::work, a * elem, (b - a) * elem);
        }
      }
      t.signal(me, done);
    }
  }
  return unit0 + 1 + static_cast<uint32_t>(steps * pieces);
}

namespace {

// Transport over the members' buffers in the instance's slots: the acting member's plane moves
// the bytes (host memcpy, or its GPU's copies and kernels); progress counters live on the host.
class SlotTransport final : public Transport {
 public:
  SlotTransport(Session& session, int64_t pos, Instance& inst, int64_t me)
      : session_(session), pos_(pos), inst_(inst), pl_(plane_of(inst, me)) {}
  void copy(int64_t dst, Buf db, int64_t doff, int64_t src, Buf sb, int64_t soff,
            int64_t bytes) override {
    pl_.copy(ptr(dst, db) + doff, ptr(src, sb) + soff, static_cast<size_t>(bytes));
  }
  void reduce(Kind op, DType dt, int64_t dst, Buf db, int64_t doff, int64_t src, Buf sb,
              int64_t soff, int64_t count) override {
    const int64_t e = static_cast<int64_t>(dtype_size(dt));
    char* d = ptr(dst, db) + doff * e;
    pl_.fold(op == Kind::pmean ? Kind::psum : op, dt, dt, d, {ptr(src, sb) + soff * e, d}, count);
  }
  // Host memory: the bytes are there when the call returns. Device memory: the unit's work is
  // only queued; a token (a GPU event) marks it, and a waiting peer's stream waits on the token,
  // so no host thread waits on a stream between pieces.
  void signal(int64_t me, uint32_t unit) override {
    if (!pl_.host()) inst_.put_token(me, unit, pl_.backend()->coll_signal(pl_.device()));
    inst_.advance(me, unit);
  }
  void wait(int64_t member, uint32_t unit) override {
    session_.wait_progress(pos_, inst_, member, unit);
    if (!pl_.host()) pl_.backend()->coll_wait_token(pl_.device(), inst_.token(member, unit));
  }

 private:
  char* ptr(int64_t m, Buf b) const {
    if (b == Buf::in) return const_cast<char*>(in_ptr(inst_, m));
    return work_of(inst_, m);
  }
  Session& session_;
  int64_t pos_;  // the acting device's mesh position
  Instance& inst_;
  Plane pl_;
};

// Runs `phase` of the ring over the members' work buffers (`count` elements), member `me`'s part.
// Pipelining granularity: pieces that stay in cache on the host; on GPUs, pieces large enough
// that a 256 MiB collective queues tens of steps, not thousands.
void ring_phase(Session& session, int64_t pos, Instance& inst, int64_t me, RingPhase phase, Kind op,
                int64_t count) {
  const Call& c = inst.call();
  const int64_t piece_bytes = plane_of(inst, me).host() ? int64_t{256} << 10 : int64_t{8} << 20;
  SlotTransport t(session, pos, inst, me);
  run_ring(t, phase, op, c.dtype, me, inst.size(), count, c.algo == Algo::bidi_ring, 1,
           piece_bytes);
}

// Every member's input, all-gathered over the ring into member `me`'s work buffer (block j =
// member j's input).
void gather_inputs(Session& session, int64_t pos, Instance& inst, int64_t me) {
  stage_own_input(inst, me, work_of(inst, me));
  ring_phase(session, pos, inst, me, RingPhase::all_gather, Kind::psum,
             inst.size() * count(inst.call().shape));
}

void ring_reduce(Session& session, int64_t pos, Instance& inst, int64_t me) {
  const Call& c = inst.call();
  char* work = work_of(inst, me);
  if (c.deterministic) {
    gather_inputs(session, pos, inst, me);
    fold_inputs(inst, me, Inputs(inst, work));
    return;
  }
  const int64_t n = count(c.shape);
  plane_of(inst, me).copy(work, in_ptr(inst, me), static_cast<size_t>(input_bytes(c)));
  ring_phase(session, pos, inst, me, RingPhase::all_reduce, c.kind, n);
  if (c.kind == Kind::pmean)  // the ring sums in the input dtype
    plane_of(inst, me).mean_from_sum(c.dtype, out_dtype(c), out_ptr(inst, me), work, n,
                                     inst.size());
}

void ring_psum_scatter(Session& session, int64_t pos, Instance& inst, int64_t me,
                       const Shape& out_shape) {
  const Call& c = inst.call();
  char* work = work_of(inst, me);
  if (c.deterministic) {  // gathered inputs, then direct's in-order fold over my block
    gather_inputs(session, pos, inst, me);
    fold_own_block(inst, me, out_shape, Inputs(inst, work));
    return;
  }
  const int64_t C = stage_scatter_chunks(inst, me, work);
  ring_phase(session, pos, inst, me, RingPhase::reduce_scatter, Kind::psum, count(c.shape));
  const size_t elem = dtype_size(c.dtype);  // chunk `me` is the output, densely laid out
  plane_of(inst, me).copy(out_ptr(inst, me), work + me * C * static_cast<int64_t>(elem),
                          static_cast<size_t>(C) * elem);
}

void ring_all_gather(Session& session, int64_t pos, Instance& inst, int64_t me,
                     const Shape& out_shape) {
  gather_inputs(session, pos, inst, me);
  const char* work = work_of(inst, me);
  if (work == out_ptr(inst, me)) return;  // gathering along axis 0: the work buffer is the output
  place_gathered(inst, me, out_shape, Inputs(inst, work));
}

}  // namespace

void ring_collective(Session& session, int64_t pos, Instance& inst, int64_t me,
                     const Shape& out_shape) {
  switch (inst.call().kind) {
    case Kind::psum:
    case Kind::pmean:
    case Kind::pmax:
    case Kind::pmin:
      ring_reduce(session, pos, inst, me);
      break;
    case Kind::all_gather:
      ring_all_gather(session, pos, inst, me, out_shape);
      break;
    case Kind::psum_scatter:
      ring_psum_scatter(session, pos, inst, me, out_shape);
      break;
    case Kind::ppermute:
      direct_ppermute(inst, me);
      break;
    case Kind::all_to_all:
      direct_all_to_all(inst, me, out_shape, /*pairwise=*/true);
      break;
  }
}

}  // namespace meshrt::coll
