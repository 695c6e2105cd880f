// bench/bounds.h: the memory bound of each collective the perf report measures, derived once.
//
// A collective over N devices of one host moves at least the bytes below through memory; the
// report divides by the fastest copy rate timed in the same run (CopyRate: memcpy or an in-place
// pass, over buffers spanning as many bytes as the collective's), which counts bytes *copied*
// (each read once and written once), so a bound is (bytes read + bytes written) / 2 / rate.
// Every output byte is written once, and every input byte that some output depends on is read at
// least once (a byte read once may feed several outputs from cache). tests/test_bounds.cpp
// recounts both from each collective's definition (which input bytes each output byte depends
// on), so a formula changed here without its derivation fails there. A measured time below its
// bound means the bound or the timer is wrong.
#pragma once

#include <algorithm>
#include <cstdint>

namespace meshrt::bench {

struct Traffic {
  double read = 0, written = 0;  // bytes, over all devices
  // The time floor in seconds at `copy_bw` bytes copied per second.
  double seconds(double copy_bw) const { return (read + written) / 2.0 / copy_bw; }
  // The bytes the collective's inputs and outputs span (they are distinct buffers). The copies a
  // bound's rate comes from span as many (time_copies' footprint), so that neither they nor the
  // collective fit a cache the other does not.
  double footprint() const { return read + written; }
};

// The copy rate a bound divides by: the fastest of the copies timed (of the collective's
// footprint), in bytes copied per second.
// A floor must hold for every run of the collective, so it takes the best rate the machine showed,
// not a typical one: on a shared VM one 16 MiB copy on 2 threads took anything from 1x to 6x the
// fastest within seconds (a neighbour holding a core for part of it), and the median of 3 copies,
// the report's rate before, was at times half the fastest, so collectives timed a moment later
// ran below their "bound" (0.5-0.9x in --quick). A rate taken from copies slowed by load can only
// overstate a ratio, never make it beatable.
class CopyRate {
 public:
  // One timed copy: `bytes` copied (over all threads; each read once and written once) in
  // `seconds`. It reads and writes as many bytes as it copies, so it counts as both too.
  void add(double bytes, double seconds) {
    best_ = std::max(best_, bytes / seconds);
    add_write(bytes, seconds);
    add_read(bytes, seconds);
  }
  // One timed round that only writes `bytes` (a memset) in `seconds`.
  void add_write(double bytes, double seconds) {
    best_write_ = std::max(best_write_, bytes / seconds);
  }
  // One timed round that only reads `bytes` in `seconds`.
  void add_read(double bytes, double seconds) {
    best_read_ = std::max(best_read_, bytes / seconds);
  }
  // Bytes copied per second by the fastest copy added; 0 before any.
  double best() const { return best_; }
  // Bytes written per second by the fastest round added, copies included; 0 before any.
  double best_write() const { return best_write_; }
  // Bytes read per second by the fastest round added, copies included; 0 before any.
  double best_read() const { return best_read_; }
  // The floor for `t`: its bytes read and written at the fastest copy rate, its bytes written
  // alone at the fastest write rate, and its bytes read alone at the fastest read rate, whichever
  // takes longest. A collective that writes far more than it reads (an all_gather: 8x) is bound
  // by how fast the machine writes, one that reads far more than it writes (a psum_scatter: 8x)
  // by how fast it reads, which half-weighting against a copy rate overstates. The terms assume
  // that reads and writes share the memory's traffic, as they do beyond the caches (the
  // footprints the report times span); within a cache a memset can write more than twice the
  // bytes a copy copies.
  double seconds(const Traffic& t) const {
    double s = t.seconds(best_);
    if (best_write_ > 0) s = std::max(s, t.written / best_write_);
    if (best_read_ > 0) s = std::max(s, t.read / best_read_);
    return s;
  }

 private:
  double best_ = 0, best_write_ = 0, best_read_ = 0;
};

// psum of P bytes per device: every device reads all N inputs' bytes (N·P once) and writes its own
// P-byte sum: read N·P, written N·P.
inline Traffic psum_traffic(double n, double p) { return {n * p, n * p}; }
// all_gather to S_out bytes per device (S_out/N each in): read the N inputs once (S_out), write N
// outputs (N·S_out).
inline Traffic all_gather_traffic(double n, double s_out) { return {s_out, n * s_out}; }
// psum_scatter of S bytes per device: read all N inputs (N·S), write N outputs of S/N (S).
inline Traffic psum_scatter_traffic(double n, double s) { return {n * s, s}; }
// all_to_all of S bytes per device: every input byte goes to one output: read N·S, write N·S.
inline Traffic all_to_all_traffic(double n, double s) { return {n * s, n * s}; }
// ppermute (a ring shift) of S bytes per device: read N·S, write N·S.
inline Traffic ppermute_traffic(double n, double s) { return {n * s, n * s}; }

// The formula as the report prints it, in units of S (or P) bytes and N devices.
inline const char* psum_formula() { return "bound N*P / copy bw"; }
inline const char* all_gather_formula() { return "(N+1)S_out/2 copy, N*S_out write"; }
inline const char* psum_scatter_formula() { return "(N+1)S/2 copy, N*S read"; }
// (A psum, all_to_all and ppermute read as much as they write: their copy term always decides.)
inline const char* all_to_all_formula() { return "bound N*S / copy bw"; }
inline const char* ppermute_formula() { return "bound N*S / copy bw"; }

}  // namespace meshrt::bench
