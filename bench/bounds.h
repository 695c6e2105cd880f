// bench/bounds.h: the memory bound of each collective the perf report measures, derived once.
//
// A collective over N devices of one host moves at least the bytes below through memory; the
// report divides by the memcpy bandwidth measured in the same run, which counts bytes *copied*
// (each read once and written once), so a bound is (bytes read + bytes written) / 2 / bandwidth.
// Every output byte is written once, and every input byte that some output depends on is read at
// least once (a byte read once may feed several outputs from cache). tests/test_bounds.cpp
// recounts both from each collective's definition (which input bytes each output byte depends
// on), so a formula changed here without its derivation fails there. A measured time below its
// bound means the bound or the timer is wrong.
#pragma once

#include <cstdint>

namespace meshrt::bench {

struct Traffic {
  double read = 0, written = 0;  // bytes, over all devices
  // The time floor in seconds at `copy_bw` bytes copied per second.
  double seconds(double copy_bw) const { return (read + written) / 2.0 / copy_bw; }
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
inline const char* psum_formula() { return "bound N*P / memcpy bw"; }
inline const char* all_gather_formula() { return "bound (N+1)*S_out/2 / memcpy bw"; }
inline const char* psum_scatter_formula() { return "bound (N+1)*S/2 / memcpy bw"; }
inline const char* all_to_all_formula() { return "bound N*S / memcpy bw"; }
inline const char* ppermute_formula() { return "bound N*S / memcpy bw"; }

}  // namespace meshrt::bench
