// bench/bench_util.h: timing helpers shared by the report programs.
#pragma once

#include <algorithm>
#include <chrono>
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

}  // namespace meshrt::bench
