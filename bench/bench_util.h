// bench/bench_util.h: timing helpers shared by the report programs.
#pragma once

#include <algorithm>
#include <barrier>
#include <chrono>
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

// Seconds of each of `reps` rounds in which `threads` threads each memcpy `bytes` of their own
// (after one warm-up round); a round copies bytes * threads in all.
inline std::vector<double> time_copies(size_t bytes, int threads, int reps) {
  std::vector<std::vector<char>> src(static_cast<size_t>(threads)),
      dst(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    src[static_cast<size_t>(t)].assign(bytes, 1);
    dst[static_cast<size_t>(t)].assign(bytes, 0);
  }
  return time_threads_each(threads, reps, /*warmup=*/1, [&](int t) {
    std::memcpy(dst[static_cast<size_t>(t)].data(), src[static_cast<size_t>(t)].data(), bytes);
  });
}

}  // namespace meshrt::bench
