#include "bench/bench_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace meshrt::bench {
namespace {

[[noreturn]] void bad(const std::string& why) { throw Error("[meshrt-bench] " + why); }

// The whole of `s` as an integer in [lo, hi].
int parse_int(const std::string& opt, const std::string& s, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
    bad(opt + " '" + s + "' is not a whole number in " + std::to_string(lo) + ".." +
        std::to_string(hi));
  }
  return static_cast<int>(v);
}

DType parse_dtype(const std::string& d) {
  if (d == "float32" || d == "float") return DType::f32;
  if (d == "float64" || d == "double") return DType::f64;
  if (d == "int32") return DType::i32;
  if (d == "int64") return DType::i64;
  if (d == "bfloat16" || d == "bf16") return DType::bf16;
  if (d == "float16" || d == "f16") return DType::f16;
  bad("unknown dtype '" + d + "'");
}

// A comma-separated list of algorithm names; "all" stands for direct, ring and bidi_ring.
std::vector<CollectiveAlgo> parse_algos(const std::string& list) {
  std::vector<CollectiveAlgo> algos;
  for (size_t at = 0; at <= list.size();) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    const std::string one = list.substr(at, end - at);
    if (one == "all") {
      algos.insert(algos.end(),
                   {CollectiveAlgo::direct, CollectiveAlgo::ring, CollectiveAlgo::bidi_ring});
    } else {
      algos.push_back(parse_collective_algo(one));
    }
    at = end + 1;
  }
  return algos;
}

}  // namespace

int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  const std::string u = end;
  if (u == "K" || u == "k")
    v *= 1024;
  else if (u == "M" || u == "m")
    v *= 1024 * 1024;
  else if (u == "G" || u == "g")
    v *= 1024.0 * 1024 * 1024;
  else if (!u.empty() || end == s.c_str())
    bad("bad size '" + s + "'");
  // Checked before the conversion: a double beyond int64_t (or NaN) has no integer value.
  if (!(v >= 0 && v <= static_cast<double>(kMaxBenchBytes))) {
    bad("size '" + s + "' is not between 0 and 1T");
  }
  return static_cast<int64_t>(v);
}

BenchArgs parse_args(int argc, const char* const* argv) {
  BenchArgs o;
  if (argc < 2) bad("which collective?");
  o.op = argv[1];
  if (o.op != "all_reduce" && o.op != "all_gather" && o.op != "reduce_scatter" &&
      o.op != "all_to_all" && o.op != "ppermute") {
    bad("unknown collective '" + o.op + "'");
  }
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) bad(a + " needs a value");
      return argv[++i];
    };
    if (a == "-b") {
      o.min_bytes = parse_size(next());
    } else if (a == "-e") {
      o.max_bytes = parse_size(next());
    } else if (a == "-f") {
      const std::string f = next();
      char* end = nullptr;
      o.factor = std::strtod(f.c_str(), &end);
      if (f.empty() || *end != '\0' || !std::isfinite(o.factor))
        bad("-f '" + f + "' is not a number");
    } else if (a == "-i") {
      o.step_bytes = parse_size(next());
    } else if (a == "-g") {
      o.devices = parse_int(a, next(), 1, 1 << 20);
      o.devices_given = true;
    } else if (a == "--procs") {
      o.procs = true;
    } else if (a == "-n") {
      o.iters = parse_int(a, next(), 1, 1 << 30);
    } else if (a == "-w") {
      o.warmup = parse_int(a, next(), 0, 1 << 30);
    } else if (a == "-c") {
      o.check = parse_int(a, next(), 0, 1 << 30);
    } else if (a == "--platform") {
      o.platform = next();
    } else if (a == "--json" || a == "-J") {
      o.json = next();
    } else if (a == "--plot") {
      o.plot = next();
    } else if (a == "--link-model") {
      o.model = LinkModel::parse(next());
    } else if (a == "-d") {
      o.dtype = parse_dtype(next());
    } else if (a == "--algo") {
      o.algos = parse_algos(next());
    } else {
      bad("unknown option '" + a + "'");
    }
  }
  if (o.min_bytes < 1 || o.max_bytes < o.min_bytes || o.devices < 1 || o.iters < 1 ||
      o.factor <= 1) {
    bad("need 1 <= -b <= -e, -g >= 1, -n >= 1, -f > 1");
  }
  return o;
}

}  // namespace meshrt::bench
