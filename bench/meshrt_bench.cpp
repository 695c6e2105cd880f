// meshrt-bench: collective microbenchmarks in the format of NVIDIA's nccl-tests.
//
//   meshrt-bench all_reduce -b 8 -e 64M -f 2 -g 8 --algo all [--link-model ring:5us:100GBps]
//                [-d float32] [-n 20] [-w 5] [-c 1] [--platform cpu] [--json FILE] [--plot
//                FILE.png]
//
// Columns and busbw factors are nccl-tests': busbw = algbw * factor, which makes it comparable
// with a link's peak bandwidth whatever the device count: all_reduce 2(n-1)/n; all_gather,
// reduce_scatter, all_to_all (n-1)/n; ppermute (a ring shift, like sendrecv) 1. size is the
// per-device buffer nccl-tests reports (all_gather: the gathered output; reduce_scatter and
// all_to_all: the input). meshrt's collectives are out-of-place (JAX semantics): the in-place
// columns read N/A. #wrong counts elements that differ from a host reference on every size.
// With --link-model the modelled time and busbw of the same algorithm follow.
//
// Several processes (runtime/distributed.h): launch under mpirun with --procs, e.g.
//   mpirun -np 2 -x MESHRT_CPU_DEVICES=4 meshrt-bench all_reduce -b 4 -e 64M --procs
// The mesh spans every process's devices (-g defaults to all of them); process 0 prints one
// table, each row timed on its devices (the closing psum synchronises every process).
#include <meshrt/meshrt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_args.h"
#include "bench/link_model.h"

using namespace meshrt;
using Clock = std::chrono::steady_clock;

namespace {

using Options = bench::BenchArgs;

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "meshrt-bench: %s\n"
      "usage: meshrt-bench all_reduce|all_gather|reduce_scatter|all_to_all|ppermute\n"
      "  -b MIN -e MAX (bytes, K/M/G suffixes) -f FACTOR | -i STEP   -g DEVICES   -d "
      "float32|float64|bfloat16|float16|int32|int64\n"
      "  -n ITERS -w WARMUP -c CHECK   --algo direct|ring|bidi_ring|native|auto|all (or a comma "
      "list)\n"
      "  --platform cpu|cuda (cuda: MESHRT_CUDA_DEVICES_PER_GPU=k splits each GPU into k devices)\n"
      "  --link-model TOPO:LATENCY:BANDWIDTH (ring|torus2d|full, e.g. ring:5us:100GBps)\n"
      "  --json FILE   --plot FILE.png (needs gnuplot)\n"
      "  --procs (under mpirun: the mesh spans every process's devices; process 0 prints)\n",
      why.c_str());
  std::exit(2);
}

std::string name_of(CollectiveAlgo a) { return std::string(collective_algo_name(a)); }

bench::Op kind_of(const std::string& op) {
  if (op == "all_gather") return bench::Op::all_gather;
  if (op == "reduce_scatter") return bench::Op::reduce_scatter;
  if (op == "all_to_all") return bench::Op::all_to_all;
  if (op == "ppermute") return bench::Op::ppermute;
  return bench::Op::all_reduce;
}

// The link model knows the one-shot and the ring schedules; native and auto are modelled as
// direct.
CollectiveAlgo modelled(CollectiveAlgo a) {
  return a == CollectiveAlgo::ring || a == CollectiveAlgo::bidi_ring ? a : CollectiveAlgo::direct;
}

double bus_factor(const std::string& op, int64_t n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "ppermute") return 1.0;
  return static_cast<double>(n - 1) / n;
}

const char* redop_of(const std::string& op) {
  return op == "all_reduce" || op == "reduce_scatter" ? "sum" : "none";
}

// Elements each device contributes for a reported size.
int64_t input_elems(const std::string& op, int64_t size_elems, int64_t n) {
  return op == "all_gather" ? size_elems / n : size_elems;
}

// The sizes measured, from -b to -e by -f or -i, rounded down to whole elements (divisible by the
// device count where the collective splits or gathers them), as nccl-tests does.
std::vector<int64_t> sizes_of(const Options& o) {
  const int64_t elem = static_cast<int64_t>(dtype_size(o.dtype));
  // all_reduce and ppermute take any count (4 B is one float per device); the others split or
  // gather it over the devices.
  const int64_t n = o.op == "all_reduce" || o.op == "ppermute" ? 1 : o.devices;
  std::vector<int64_t> sizes;
  for (int64_t s = o.min_bytes; s <= o.max_bytes;) {
    int64_t e = std::max<int64_t>(n, (s / elem) / n * n);
    if (sizes.empty() || sizes.back() != e * elem) sizes.push_back(e * elem);
    s = o.step_bytes > 0 ? s + o.step_bytes : static_cast<int64_t>(std::ceil(s * o.factor));
  }
  return sizes;
}

struct Result {
  CollectiveAlgo algo;
  int64_t size, count;
  double time_us, algbw, busbw;
  int64_t wrong;
  double model_us = -1, model_busbw = -1;
};

// The baseline a collective's bandwidth is judged against, measured in the same run: one
// device-to-device copy of `bytes` from mesh device 0 to device 1 through the runtime (a
// device_put between single-device shardings: memcpy on cpu, cudaMemcpy on cuda). Median of
// `reps` copies, in bytes per second; 0 on a one-device mesh.
double copy_bandwidth(const Mesh& mesh, int64_t bytes, int reps) {
  if (mesh.devices().size() < 2) return 0;
  const int64_t n = std::max<int64_t>(1, bytes / 4);
  Array x = device_put(std::vector<float>(static_cast<size_t>(n), 1.f), {n},
                       SingleDeviceSharding(mesh.devices()[0]));
  const SingleDeviceSharding to(mesh.devices()[1]);
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    auto t0 = Clock::now();
    device_put(x, to).block_until_ready();  // a device platform queues the copy: wait for it
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r >= 2) t.push_back(dt);  // two warm-up copies (allocation, first touch)
  }
  std::sort(t.begin(), t.end());
  return static_cast<double>(n * 4) / t[t.size() / 2];
}

std::string fmt(double v) {
  char b[32];
  if (v >= 1e6)
    std::snprintf(b, sizeof b, "%.0f", v);
  else if (v >= 1e4)
    std::snprintf(b, sizeof b, "%.1f", v);
  else
    std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

void print_header(const Options& o, const Mesh& mesh) {
  std::printf("# meshrt-bench (nccl-tests format)\n# Collective test starting: %s_perf\n",
              o.op.c_str());
  if (o.procs) {
    std::printf("# Processes: %d x %zu %s devices (mpirun)\n", process_count(),
                local_devices(o.platform).size(), o.platform.c_str());
  }
  std::printf(
      "# nThread 1 nGpus %d minBytes %lld maxBytes %lld step: %g(factor) warmup iters: %d iters: "
      "%d "
      "agg iters: 1 validation: %d graph: 0\n#\n# Using devices\n",
      o.devices, static_cast<long long>(o.min_bytes), static_cast<long long>(o.max_bytes), o.factor,
      o.warmup, o.iters, o.check);
  for (const Device& d : mesh.devices()) {
    std::printf("#  Rank %2d Group  0 on %s device %2d [%s, %u hardware threads]\n",
                static_cast<int>(&d - mesh.devices().data()), d.platform().data(), d.local_index(),
                d.str().c_str(), std::thread::hardware_concurrency());
  }
  if (o.model) std::printf("# Link model: %s\n", o.model->str().c_str());
}

void print_table_header(const Options& o, CollectiveAlgo algo) {
  std::printf("#\n# Algorithm: %s\n#\n", name_of(algo).c_str());
  std::printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s%s\n", "", "", "", "", "",
              "out-of-place", "", "", "", "in-place", "", "", "", o.model ? "      modelled" : "");
  std::printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s%s\n", "size", "count",
              "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
              "#wrong", o.model ? "      time   busbw" : "");
  std::printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s%s\n", "(B)", "(elements)",
              "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "",
              o.model ? "      (us)  (GB/s)" : "");
}

void print_row(const Options& o, const Result& r) {
  std::printf("  %10lld %12lld %8s %6s %6d %9s %7s %7s %6lld %9s %7s %7s %6s",
              static_cast<long long>(r.size), static_cast<long long>(r.count),
              dtype_name(o.dtype).data(), redop_of(o.op), -1, fmt(r.time_us).c_str(),
              fmt(r.algbw).c_str(), fmt(r.busbw).c_str(), static_cast<long long>(r.wrong), "N/A",
              "N/A", "N/A", "N/A");
  if (o.model) std::printf(" %9s %7s", fmt(r.model_us).c_str(), fmt(r.model_busbw).c_str());
  std::printf("\n");
  std::fflush(stdout);
}

// The input: `per` elements on each device, device d holding values d + (e % 7), exact sums in
// every dtype. `host` receives the same values, device-major.
Array make_input(const Options& o, const Mesh& mesh, int64_t per, std::vector<double>& host) {
  const int64_t n = o.devices;
  host.assign(static_cast<size_t>(per * n), 0);
  for (int64_t d = 0; d < n; ++d) {
    for (int64_t e = 0; e < per; ++e)
      host[static_cast<size_t>(d * per + e)] = static_cast<double>(d + e % 7);
  }
  const NamedSharding sharding(mesh, P("x"));
  switch (o.dtype) {
    case DType::f32:
      return device_put(std::vector<float>(host.begin(), host.end()), {per * n}, sharding);
    case DType::f64:
      return device_put(host, {per * n}, sharding);
    case DType::i32:
      return device_put(std::vector<int32_t>(host.begin(), host.end()), {per * n}, sharding);
    case DType::bf16:
    case DType::f16: {  // small integers: the sums are exact in 16 bits too
      Array f = device_put(std::vector<float>(host.begin(), host.end()), {per * n}, sharding);
      return astype(f, o.dtype);
    }
    default:
      return device_put(std::vector<int64_t>(host.begin(), host.end()), {per * n}, sharding);
  }
}

// Elements of device d's result that differ from the host reference.
int64_t count_wrong(const Options& o, const std::vector<double>& host, int64_t per, int64_t d,
                    const Tensor& result) {
  const int64_t n = o.devices;
  const std::vector<double> got = astype(result, DType::f64).to_vector<double>();
  int64_t wrong = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    double want;
    const auto ei = static_cast<int64_t>(e);
    if (o.op == "all_reduce") {
      want = static_cast<double>(n * (n - 1) / 2 + n * (ei % 7));
    } else if (o.op == "all_gather") {
      want = host[e];
    } else if (o.op == "reduce_scatter") {
      want = static_cast<double>(n * (n - 1) / 2 + n * ((d * (per / n) + ei) % 7));
    } else if (o.op == "all_to_all") {
      const int64_t c = per / n, j = ei / c;  // chunk j came from device j
      want = host[static_cast<size_t>(j * per + d * c + ei % c)];
    } else {
      const int64_t src = (d + n - 1) % n;
      want = host[static_cast<size_t>(src * per + ei)];
    }
    wrong += got[e] != want;
  }
  return wrong;
}

// One size under one algorithm: the average time over devices (nccl-tests -a 1), bandwidths, the
// elements every device got wrong, and the link model's figures.
Result measure(const Options& o, const Mesh& mesh, CollectiveAlgo algo, int64_t size) {
  const int64_t n = o.devices, elem = static_cast<int64_t>(dtype_size(o.dtype));
  const int64_t per = input_elems(o.op, size / elem, n);
  std::vector<double> host;
  Array x = make_input(o, mesh, per, host);
  const CollectiveOptions co{algo};
  std::vector<std::pair<int64_t, int64_t>> shift;
  for (int64_t i = 0; i < n; ++i) shift.emplace_back(i, (i + 1) % n);
  auto op = [&](Context& c, const Tensor& t) -> Tensor {
    if (o.op == "all_reduce") return c.psum(t, "x", co);
    if (o.op == "all_gather") return c.all_gather(t, "x", 0, true, co);
    if (o.op == "reduce_scatter") return c.psum_scatter(t, "x", 0, true, co);
    if (o.op == "all_to_all") return c.all_to_all(t, "x", 0, 0, true, co);
    return c.ppermute(t, "x", shift);
  };
  std::vector<double> per_device(static_cast<size_t>(n));
  std::vector<Tensor> checked(static_cast<size_t>(n));
  shard_map(
      [&](Context& c, const Tensor& t) {
        Tensor one = ones({1}, DType::f32, c.device());
        for (int w = 0; w < o.warmup; ++w) op(c, t);
        c.psum(one, "x");
        auto t0 = Clock::now();
        for (int it = 0; it < o.iters; ++it) op(c, t);
        // Every member's work done on its device (a small psum may end without a host wait).
        c.psum(one, "x").block_until_ready();
        per_device[static_cast<size_t>(c.axis_index("x"))] =
            std::chrono::duration<double>(Clock::now() - t0).count() / o.iters;
        if (o.check > 0) checked[static_cast<size_t>(c.axis_index("x"))] = op(c, t);
        return t;
      },
      mesh, {P("x")}, P("x"))(x);
  // This process's devices (every device with one process).
  double t = 0;
  int64_t mine = 0;
  for (int64_t d = 0; d < n; ++d) {
    if (mesh.devices()[static_cast<size_t>(d)].process_index() != process_index()) continue;
    t += per_device[static_cast<size_t>(d)];
    ++mine;
  }
  t /= static_cast<double>(mine);
  int64_t wrong = 0;
  if (o.check > 0) {
    for (int64_t d = 0; d < n; ++d) {
      if (checked[static_cast<size_t>(d)].valid())
        wrong += count_wrong(o, host, per, d, checked[static_cast<size_t>(d)]);
    }
  }
  Result res{algo, size, size / elem, t * 1e6, size / t / 1e9, size / t / 1e9 * bus_factor(o.op, n),
             wrong};
  if (o.model) {
    const double mt =
        o.model->collective_time(kind_of(o.op), modelled(algo), n, static_cast<double>(size));
    res.model_us = mt * 1e6;
    res.model_busbw = mt > 0 ? size / mt / 1e9 * bus_factor(o.op, n) : 0;
  }
  return res;
}

// Every size under one algorithm, a row each; `done` counts the measurements for the progress
// line.
void sweep_sizes(const Options& o, const Mesh& mesh, CollectiveAlgo algo,
                 const std::vector<int64_t>& sizes, size_t& done, std::vector<Result>& results) {
  print_table_header(o, algo);
  for (int64_t size : sizes) {
    ++done;
    if (process_index() == 0) {
      std::fprintf(stderr, "\r[meshrt-bench] %s %s %lld B (%zu/%zu)   ", o.op.c_str(),
                   name_of(algo).c_str(), static_cast<long long>(size), done,
                   sizes.size() * o.algos.size());
    }
    results.push_back(measure(o, mesh, algo, size));
    print_row(o, results.back());
  }
}

// nccl-tests' footer, then per algorithm: busbw at the largest size against the copy baseline,
// and the time at the smallest (the small-message latency). Returns the wrong elements in all.
int64_t print_footer(const Options& o, const std::vector<Result>& results, double copy_bw) {
  int64_t total_wrong = 0;
  double avg = 0;
  for (const Result& r : results) {
    total_wrong += r.wrong;
    avg += r.busbw;
  }
  std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
              total_wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %s\n#\n",
              fmt(avg / static_cast<double>(results.size())).c_str());
  for (CollectiveAlgo a : o.algos) {
    const Result* small = nullptr;
    const Result* large = nullptr;
    for (const Result& r : results) {
      if (r.algo != a) continue;
      if (!small || r.size < small->size) small = &r;
      if (!large || r.size > large->size) large = &r;
    }
    if (!small) continue;
    std::printf("# %-9s latency at %lld B: %s us;  busbw at %lld B: %s GB/s", name_of(a).c_str(),
                static_cast<long long>(small->size), fmt(small->time_us).c_str(),
                static_cast<long long>(large->size), fmt(large->busbw).c_str());
    if (copy_bw > 0) std::printf(" = %.2fx the copy bandwidth", large->busbw * 1e9 / copy_bw);
    std::printf("\n");
  }
  std::printf("#\n# Collective test concluded: %s_perf\n", o.op.c_str());
  return total_wrong;
}

void write_json(const Options& o, const std::vector<Result>& results, double copy_bw) {
  std::ofstream js(o.json);
  js << "[\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    js << "  {\"collective\": \"" << o.op << "\", \"algo\": \"" << name_of(r.algo)
       << "\", \"devices\": " << o.devices << ", \"size\": " << r.size << ", \"count\": " << r.count
       << ", \"type\": \"" << dtype_name(o.dtype) << "\", \"redop\": \"" << redop_of(o.op)
       << "\", \"root\": -1, \"out_of_place\": {\"time\": " << r.time_us
       << ", \"alg_bw\": " << r.algbw << ", \"bus_bw\": " << r.busbw << ", \"nwrong\": " << r.wrong
       << "}";
    if (o.model)
      js << ", \"model\": {\"time\": " << r.model_us << ", \"bus_bw\": " << r.model_busbw << "}";
    js << ", \"copy_bw\": " << copy_bw / 1e9;
    js << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  js << "]\n";
}

// busbw against size, one line per algorithm (and its model), through gnuplot. False when
// gnuplot is missing or fails (the data file stays).
bool write_plot(const Options& o, const std::vector<Result>& results) {
  const std::string dat = o.plot + ".dat", gp = o.plot + ".gp";
  std::ofstream d(dat);
  for (CollectiveAlgo a : o.algos) {
    d << "# " << name_of(a) << "\n";
    for (const Result& r : results) {
      if (r.algo == a)
        d << r.size << " " << r.busbw << " " << (o.model ? r.model_busbw : 0) << "\n";
    }
    d << "\n\n";
  }
  d.close();
  std::ofstream g(gp);
  g << "set terminal pngcairo size 900,560 noenhanced\nset output '" << o.plot
    << "'\nset logscale x 2\n"
    << "set logscale y 10\nset format x '%.0b%B'\nset key left top\n"
    << "set xlabel 'size (bytes per device)'\nset ylabel 'busbw (GB/s, log scale)'\nset grid\n"
    << "set title 'meshrt-bench " << o.op << ", " << o.devices << " " << o.platform << " devices"
    << (o.model ? ", modelled: " + o.model->str() : std::string()) << "'\nplot ";
  for (size_t i = 0; i < o.algos.size(); ++i) {
    g << (i ? ", " : "") << "'" << dat << "' index " << i
      << " using 1:2 with linespoints lw 2 title '" << name_of(o.algos[i]) << " (measured)'";
    if (o.model) {
      g << ", '" << dat << "' index " << i << " using 1:3 with lines dt 2 lw 2 title '"
        << name_of(o.algos[i]) << " (modelled)'";
    }
  }
  g << "\n";
  g.close();
  if (std::system(("gnuplot " + gp + " 2>/dev/null").c_str()) != 0) {
    std::fprintf(
        stderr,
        "[meshrt-bench] --plot needs gnuplot (apt-get install gnuplot-nox); data left in %s\n",
        dat.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = bench::parse_args(argc, argv);
  } catch (const Error& e) {
    usage(e.what());
  }
  try {
    if (o.procs) {
      // Each process's devices come from its environment (mpirun -x MESHRT_CPU_DEVICES=n).
      distributed::initialize();
      if (process_index() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;
      if (!o.devices_given) o.devices = static_cast<int>(devices(o.platform).size());
    } else if (o.platform == "cpu") {
      set_cpu_device_count(std::max(o.devices, 1));
    }
    const Mesh mesh = make_mesh({o.devices}, {"x"}, o.platform);
    print_header(o, mesh);
    const std::vector<int64_t> sizes = sizes_of(o);
    const double copy_bw = copy_bandwidth(mesh, sizes.back(), 7);
    if (copy_bw > 0) {
      std::printf("# Baseline: device-to-device copy %s -> %s of %lld B: %s GB/s (median of 7)\n",
                  mesh.devices()[0].str().c_str(), mesh.devices()[1].str().c_str(),
                  static_cast<long long>(sizes.back()), fmt(copy_bw / 1e9).c_str());
    }
    std::vector<Result> results;
    size_t done = 0;
    for (CollectiveAlgo algo : o.algos) sweep_sizes(o, mesh, algo, sizes, done, results);
    if (process_index() == 0) std::fprintf(stderr, "\r%60s\r", "");
    const int64_t total_wrong = print_footer(o, results, copy_bw);
    if (!o.json.empty()) write_json(o, results, copy_bw);
    if (!o.plot.empty() && !write_plot(o, results)) return 1;
    return total_wrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n%s\n", e.what());
    return 1;
  }
}
