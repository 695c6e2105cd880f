#include "collectives/ring.h"

#include <algorithm>

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

}  // namespace meshrt::coll
