// bench/bench_args.h: meshrt-bench's command line. parse_args turns argv into BenchArgs or throws
// meshrt::Error naming the bad argument (meshrt-bench prints it with its usage and exits 2); no
// argument crashes it or makes it loop.
#pragma once

#include <meshrt/meshrt.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/link_model.h"

namespace meshrt::bench {

// The largest -b / -e / -i: 1 TiB per device.
inline constexpr int64_t kMaxBenchBytes = int64_t{1} << 40;

struct BenchArgs {
  std::string op = "all_reduce";
  int64_t min_bytes = 32 << 20, max_bytes = 32 << 20;
  double factor = 2;
  int64_t step_bytes = 0;
  int devices = 8;
  std::string platform = "cpu";
  std::vector<CollectiveAlgo> algos{CollectiveAlgo::direct};
  DType dtype = DType::f32;
  int iters = 20, warmup = 5, check = 1;
  std::optional<LinkModel> model;
  std::string json, plot;
  bool procs = false;  // --procs: one of several processes under mpirun
  bool devices_given = false;
};

BenchArgs parse_args(int argc, const char* const* argv);

// A byte count with an optional K/M/G suffix (powers of 1024), 0..kMaxBenchBytes.
int64_t parse_size(const std::string& s);

}  // namespace meshrt::bench
