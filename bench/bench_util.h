// bench/bench_util.h: timing helpers shared by the report programs.
#pragma once

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace meshrt::bench {

using Clock = std::chrono::steady_clock;

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds from the earliest start to the latest end.
inline double span(const std::vector<Clock::time_point>& start,
                   const std::vector<Clock::time_point>& end) {
  return std::chrono::duration<double>(*std::max_element(end.begin(), end.end()) -
                                       *std::min_element(start.begin(), start.end()))
      .count();
}

// Seconds for n threads to run fn(i) once each, per round, from the first thread's start to the
// last thread's end, each thread timing itself: a launching thread that timed them would compete
// with them for the cores and could start its clock after they had begun (on 2 cores, memcpy rates
// of 35-70 GB/s from run to run). The first `warmup` rounds are not returned.
inline std::vector<double> time_threads_each(int n, int reps, int warmup,
                                             const std::function<void(int)>& fn) {
  std::vector<double> s;
  for (int r = 0; r < warmup + reps; ++r) {
    std::vector<Clock::time_point> start(static_cast<size_t>(n)), end(static_cast<size_t>(n));
    std::barrier sync(n);
    std::vector<std::thread> pool;
    for (int i = 0; i < n; ++i) {
      pool.emplace_back([&, i] {
        sync.arrive_and_wait();
        start[static_cast<size_t>(i)] = Clock::now();
        fn(i);
        end[static_cast<size_t>(i)] = Clock::now();
      });
    }
    for (auto& th : pool) th.join();
    if (r >= warmup) s.push_back(span(start, end));
  }
  return s;
}

// The median of time_threads_each's rounds.
inline double time_threads(int n, int reps, int warmup, const std::function<void(int)>& fn) {
  return median(time_threads_each(n, reps, warmup, fn));
}

// One timed round of moving bytes through memory: `bytes` copied over all threads (each read once
// and written once) in `seconds`; for a write round, `bytes` written; for a read round, read.
struct CopyRound {
  enum class Kind { copy, write, read };
  double bytes = 0, seconds = 0;
  Kind kind = Kind::copy;
};

// 4 * `reps` rounds (after one warm-up round each) on `threads` threads whose buffers together
// span `footprint` bytes, an equal share each: `reps` in which each thread memcpys the first half
// of its share into the second, `reps` in which each rewrites its whole share in place (every
// byte read once and written once, as a copy, but with no read for ownership of the written
// lines), `reps` in which each memsets its whole share (writes: glibc's memset streams large
// sizes past the cache; a write-heavy collective's floor is the machine's write rate), and
// `reps` in which each reads its whole share (reads: a read-heavy collective's, a psum_scatter's).
// Both count: a bound takes the fastest round, and glibc's memcpy is not always the fastest way a
// machine moves bytes (on the project's 2-core VM the in-place pass ran 1.7x faster, and a psum
// beat a bound taken from memcpy alone). The footprint is the caller's to match: copies within a
// cache run at the cache's speed (an in-place pass over 2 x 16 MiB ran at 60+ GB/s in this VM's 32
// MiB L3, over 2 x 64 MiB at 25-30 GB/s), so a bound for a collective whose buffers span 144 MiB
// must come from copies that span as much.
inline std::vector<CopyRound> time_copies(size_t footprint, int threads, int reps) {
  const size_t share = footprint / static_cast<size_t>(threads) / 128 * 128, half = share / 2;
  std::vector<std::vector<char>> buf(static_cast<size_t>(threads));
  for (auto& b : buf) b.assign(share, 1);
  std::vector<CopyRound> rounds;
  for (double s : time_threads_each(threads, reps, /*warmup=*/1, [&](int t) {
         char* p = buf[static_cast<size_t>(t)].data();
         std::memcpy(p + half, p, half);
       })) {
    rounds.push_back({static_cast<double>(half) * threads, s});
  }
  for (double s : time_threads_each(threads, reps, /*warmup=*/1, [&](int t) {
         // In 8-byte words: a char store may alias anything, `share` (captured by reference)
         // included, so a char loop reloads its bound every byte and is not vectorised; it ran at
         // a fifth of the memory's speed and made this floor 2x too low (a psum then "beat" it).
         auto* p = reinterpret_cast<uint64_t*>(buf[static_cast<size_t>(t)].data());
         const size_t words = share / sizeof(uint64_t);
         for (size_t i = 0; i < words; ++i) p[i] ^= 0x5a5a5a5a5a5a5a5aULL;
         asm volatile("" : : "r"(p) : "memory");  // the writes are the work: keep them
       })) {
    rounds.push_back({static_cast<double>(share) * threads, s});
  }
  for (double s : time_threads_each(threads, reps, /*warmup=*/1, [&](int t) {
         std::memset(buf[static_cast<size_t>(t)].data(), 0x20 + t, share);
         asm volatile("" : : "r"(buf[static_cast<size_t>(t)].data()) : "memory");
       })) {
    rounds.push_back({static_cast<double>(share) * threads, s, CopyRound::Kind::write});
  }
  std::vector<uint64_t> sink(static_cast<size_t>(threads));
  for (double s : time_threads_each(threads, reps, /*warmup=*/1, [&](int t) {
         // Four independent sums of 8-byte words, so the loads, not one add chain, set the pace.
         const auto* p = reinterpret_cast<const uint64_t*>(buf[static_cast<size_t>(t)].data());
         const size_t words = share / sizeof(uint64_t);
         uint64_t a = 0, b = 0, c = 0, d = 0;
         for (size_t i = 0; i + 4 <= words; i += 4) {
           a += p[i];
           b += p[i + 1];
           c += p[i + 2];
           d += p[i + 3];
         }
         sink[static_cast<size_t>(t)] = a + b + c + d;  // the reads are the work: keep them
       })) {
    rounds.push_back({static_cast<double>(share) * threads, s, CopyRound::Kind::read});
  }
  asm volatile("" : : "r"(sink.data()) : "memory");
  return rounds;
}

}  // namespace meshrt::bench
