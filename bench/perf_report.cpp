// meshrt-perf-report: the numbers of the shard_map issue, each with the baseline it is judged
// against, measured in the same run (medians of repeated runs; this machine is shared and noisy).
//
//   ./run.sh perf            (or build/bench/meshrt-perf-report [--quick] [--no-mpi])
//   build/bench/meshrt-perf-report --psum-dtypes [ROUNDS]   issue 28's rows alone: psum float32
//       64 MiB, bfloat16 64 MiB and bfloat16 16 Mi elements on 8 devices, in turn ROUNDS times
//       (default 5), each against the fastest copy timed so far (copies before and after every
//       round); per-round and median ratios
//   build/bench/meshrt-perf-report --devices [MAX]   the devices table alone, 8..MAX devices
//       (default 256; MAX up to 4096)
//
// Bounds (bench/bounds.h): the minimal bytes each collective reads and writes, at the fastest rate
// timed in this run for reading and writing each byte once (a memcpy or an in-place pass over the
// same bytes): psum N*P; all_gather (N+1)*S_out/2; psum_scatter (N+1)*S/2; all_to_all and
// ppermute N*S (P, S = bytes per device, N = devices). tests/test_bounds.cpp recounts them.
#include <meshrt/meshrt.h>

#include <algorithm>
#include <barrier>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bench/bench_util.h"
#include "bench/bounds.h"

using namespace meshrt;
using meshrt::bench::Clock;
using meshrt::bench::CopyRate;
using meshrt::bench::median;
using meshrt::bench::seconds_since;
using meshrt::bench::span;
using meshrt::bench::time_copies;
using meshrt::bench::time_threads;

namespace {

// Times `reps` rounds of each kind of copy spanning `footprint` bytes (time_copies) on one thread
// and on all cores into `rate`: a collective may run at either's pace (a neighbour holding a
// core), and its floor is the faster.
void probe_copies(CopyRate& rate, size_t footprint, int cores, int reps) {
  for (int threads : {1, cores}) {
    for (const meshrt::bench::CopyRound& r : time_copies(footprint, threads, reps)) {
      switch (r.kind) {
        case meshrt::bench::CopyRound::Kind::copy:
          rate.add(r.bytes, r.seconds);
          break;
        case meshrt::bench::CopyRound::Kind::write:
          rate.add_write(r.bytes, r.seconds);
          break;
        case meshrt::bench::CopyRound::Kind::read:
          rate.add_read(r.bytes, r.seconds);
          break;
      }
    }
  }
}

// The fastest copy rate of each footprint timed in this run; probe() times more copies first.
struct CopyRates {
  int cores, reps;
  std::map<size_t, CopyRate> by_footprint;
  // Times more copies of t's footprint, then gives t's floor (CopyRate::seconds).
  double bound(const meshrt::bench::Traffic& t) {
    const auto footprint = static_cast<size_t>(t.footprint());
    probe_copies(by_footprint[footprint], footprint, cores, reps);
    return by_footprint[footprint].seconds(t);
  }
  // t's floor from the copies timed so far.
  double floor(const meshrt::bench::Traffic& t) {
    return by_footprint[static_cast<size_t>(t.footprint())].seconds(t);
  }
};

// Seconds for `threads` threads to psum n inputs of `bytes` float32s each into n outputs of
// `bytes`, written by hand with the best technique known here (no runtime: plain threads, each
// a contiguous share of the elements): each 64-byte line summed from the n inputs in order and
// stored to every output with non-temporal stores (no read for ownership), as the cpu platform's
// fold_to does; median over reps. Where the CPU has no AVX2, the same through the cache.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) void hand_psum_lines(const std::vector<const float*>& in,
                                                     const std::vector<float*>& out, int64_t lo,
                                                     int64_t hi) {
  const size_t n = in.size();
  for (int64_t e = lo; e < hi; e += 16) {
    __m256 a = _mm256_add_ps(_mm256_load_ps(in[0] + e), _mm256_load_ps(in[1] + e));
    __m256 b = _mm256_add_ps(_mm256_load_ps(in[0] + e + 8), _mm256_load_ps(in[1] + e + 8));
    for (size_t j = 2; j < n; ++j) {
      a = _mm256_add_ps(a, _mm256_load_ps(in[j] + e));
      b = _mm256_add_ps(b, _mm256_load_ps(in[j] + e + 8));
    }
    for (float* o : out) {
      _mm256_stream_ps(o + e, a);
      _mm256_stream_ps(o + e + 8, b);
    }
  }
  _mm_sfence();
}
#endif
double hand_psum_seconds(int64_t n, size_t bytes, int threads, int reps) {
  const auto elems = static_cast<int64_t>(bytes / sizeof(float));
  auto alloc = [&](float v) {
    auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
    std::fill(p, p + elems, v);
    return p;
  };
  std::vector<const float*> in;
  std::vector<float*> out;
  for (int64_t j = 0; j < n; ++j) {
    in.push_back(alloc(1.0f + static_cast<float>(j)));
    out.push_back(alloc(0.0f));
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const bool avx2 = __builtin_cpu_supports("avx2");
#endif
  const double t = time_threads(threads, reps, 1, [&](int t) {
    const int64_t lines = elems / 16;
    const int64_t lo = lines * t / threads * 16, hi = lines * (t + 1) / threads * 16;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (avx2) return hand_psum_lines(in, out, lo, hi);
#endif
    for (int64_t e = lo; e < hi; ++e) {
      float x = in[0][e] + in[1][e];
      for (int64_t j = 2; j < n; ++j) x += in[static_cast<size_t>(j)][e];
      for (float* o : out) o[e] = x;
    }
  });
  for (const float* p : in) std::free(const_cast<float*>(p));
  for (float* p : out) std::free(p);
  return t;
}

// Seconds for `threads` threads to fold n inputs of `bytes` float32s each into n outputs of
// bytes / n (output d sums every input's slice d, in input order): psum_scatter's memory work
// written by hand, one pass per input over the whole output (on this machine that beats folding
// L1-sized tiles of all inputs at once: 4.4-5.9 ms against 6.5-7.7 ms for 8 x 16 MiB), the
// devices' outputs dealt round-robin to the threads (time_threads; median over reps).
double hand_fold_seconds(int64_t n, size_t bytes, int threads, int reps) {
  const auto elems = static_cast<int64_t>(bytes / sizeof(float)), part = elems / n;
  std::vector<std::vector<float>> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    in[static_cast<size_t>(j)].assign(static_cast<size_t>(elems), 1.0f + static_cast<float>(j));
    out[static_cast<size_t>(j)].assign(static_cast<size_t>(part), 0.0f);
  }
  return time_threads(threads, reps, 0, [&](int t) {
    for (int64_t d = t; d < n; d += threads) {
      float* __restrict o = out[static_cast<size_t>(d)].data();
      const float* __restrict a = in[0].data() + d * part;
      const float* __restrict b = in[1].data() + d * part;
      for (int64_t e = 0; e < part; ++e) o[e] = a[e] + b[e];
      for (int64_t j = 2; j < n; ++j) {
        const float* __restrict c = in[static_cast<size_t>(j)].data() + d * part;
        for (int64_t e = 0; e < part; ++e) o[e] += c[e];
      }
    }
  });
}

// Seconds per call of op on a mesh of the first n cpu devices, each device holding `elems`
// floats: iterations timed on device 0 between two synchronising psums; one sample per rep.
std::vector<double> op_samples(int64_t n, int64_t elems, int iters, int reps,
                               const std::function<Tensor(Context&, const Tensor&)>& op,
                               DType dtype = DType::f32) {
  Mesh mesh = make_mesh({n}, {"x"});
  std::vector<float> host(static_cast<size_t>(n * elems), 1.0f);
  Array x = device_put(host, {n * elems}, NamedSharding(mesh, P("x")));
  if (dtype != DType::f32) x = astype(x, dtype);
  std::vector<double> samples;
  std::vector<Clock::time_point> start(static_cast<size_t>(n)), end(static_cast<size_t>(n));
  shard_map(
      [&](Context& ctx, const Tensor& t) {
        Tensor one = tensor(std::vector<float>{1.f}, {1}, ctx.device());
        op(ctx, t);  // warm-up: first touch of the output buffers
        const auto me = static_cast<size_t>(ctx.axis_index("x"));
        for (int r = 0; r < reps; ++r) {
          ctx.psum(one, "x");
          start[me] = Clock::now();  // each device's own: a device may start before device 0
          for (int i = 0; i < iters; ++i) op(ctx, t);
          end[me] = Clock::now();
          ctx.psum(one, "x");
          if (me == 0) samples.push_back(span(start, end) / iters);
        }
        return t;
      },
      mesh, {P("x")}, P("x"))(x);
  return samples;
}

// The median of op_samples.
double time_op(int64_t n, int64_t elems, int iters, int reps,
               const std::function<Tensor(Context&, const Tensor&)>& op, DType dtype = DType::f32) {
  return median(op_samples(n, elems, iters, reps, op, dtype));
}

// Seconds per whole shard_map call whose body is one psum of one float per device (placing the
// input, running the 8 bodies, assembling the output): the median over every call of all reps.
double shard_map_call_latency(int64_t n, int iters, int reps) {
  Mesh mesh = make_mesh({n}, {"x"});
  Array x = device_put(std::vector<float>(static_cast<size_t>(n), 1.0f), {n},
                       NamedSharding(mesh, P("x")));
  auto f =
      shard_map([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, mesh, {P("x")}, P());
  for (int i = 0; i < iters / 10; ++i) f(x);  // warm-up
  std::vector<double> calls;
  calls.reserve(static_cast<size_t>(iters) * reps);
  for (int r = 0; r < reps * iters; ++r) {
    auto t0 = Clock::now();
    f(x);
    calls.push_back(seconds_since(t0));
  }
  return median(calls);
}

// Per-call latency of op (one float per device): every call timed on device 0, which returns
// only once all devices arrived. Returns {median, mean} over all calls of all reps.
std::pair<double, double> latency_op(int64_t n, int iters, int reps,
                                     const std::function<Tensor(Context&, const Tensor&)>& op) {
  Mesh mesh = make_mesh({n}, {"x"});
  Array x = device_put(std::vector<float>(static_cast<size_t>(n), 1.0f), {n},
                       NamedSharding(mesh, P("x")));
  std::vector<double> calls;
  calls.reserve(static_cast<size_t>(iters) * reps);
  shard_map(
      [&](Context& ctx, const Tensor& t) {
        const bool timer = ctx.axis_index("x") == 0;
        for (int i = 0; i < iters / 10; ++i) op(ctx, t);  // warm-up
        for (int r = 0; r < reps * iters; ++r) {
          auto t0 = Clock::now();
          op(ctx, t);
          if (timer) calls.push_back(seconds_since(t0));
        }
        return t;
      },
      mesh, {P("x")}, P("x"))(x);
  double mean = 0;
  for (double c : calls) mean += c;
  return {median(calls), mean / static_cast<double>(calls.size())};
}

// A plain std::barrier "psum" of one float with n threads: write, barrier, sum, barrier.
double barrier_psum_latency(int n, int iters, int reps) {
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    std::vector<float> slots(static_cast<size_t>(n), 1.f), out(static_cast<size_t>(n));
    std::barrier sync(n);
    std::vector<std::thread> pool;
    auto t0 = Clock::now();
    for (int t = 0; t < n; ++t) {
      pool.emplace_back([&, t] {
        for (int i = 0; i < iters; ++i) {
          slots[static_cast<size_t>(t)] = static_cast<float>(i);
          sync.arrive_and_wait();
          float s = 0;
          for (float v : slots) s += v;
          out[static_cast<size_t>(t)] = s;
          sync.arrive_and_wait();
        }
      });
    }
    for (auto& th : pool) th.join();
    samples.push_back(seconds_since(t0) / iters);
  }
  return median(samples);
}

// Open MPI MPI_Allreduce with n ranks (mpirun --oversubscribe); seconds, or -1 if unavailable.
double mpi_allreduce(int n, size_t bytes, int iters, int reps) {
#ifdef MESHRT_MPI_BASELINE
  std::string cmd =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to "
      "none "
      "--mca btl self,vader -np " +
      std::to_string(n) + " " MESHRT_MPI_BASELINE " " + std::to_string(bytes) + " " +
      std::to_string(iters) + " " + std::to_string(reps) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::vector<double> us;
  char line[256];
  while (fgets(line, sizeof line, p)) {
    double v;
    if (std::sscanf(line, "us %lf", &v) == 1) us.push_back(v);
  }
  pclose(p);
  return us.empty() ? -1 : median(us) * 1e-6;
#else
  (void)n, (void)bytes, (void)iters, (void)reps;
  return -1;
#endif
}

void row(const char* what, double t, const char* base_name, double base, const char* target) {
  if (base > 0) {
    std::printf("| %-44s | %10.1f us | %-30s | %10.1f us | %6.2fx | %-10s |\n", what, t * 1e6,
                base_name, base * 1e6, t / base, target);
  } else {
    std::printf("| %-44s | %10.1f us | %-30s | %13s | %7s | %-10s |\n", what, t * 1e6, base_name,
                "n/a", "n/a", target);
  }
}

// The psum over growing device counts: one float, 4 KiB and 64 KiB per device, time per call and
// per device. Above 256 devices, fewer calls per sample (a call there takes milliseconds).
void devices_table(int64_t max_devices, bool quick, int reps) {
  auto psum = [](Context& c, const Tensor& t) { return c.psum(t, "x"); };
  std::printf("\n# psum vs number of simulated devices (time per call; per device)\n");
  std::printf(
      "| devices | psum 1 float | per device | psum 4 KiB/device | per device | psum 64 KiB/device "
      "| per device |\n|---|---|---|---|---|---|---|\n");
  for (int64_t d = 8; d <= max_devices; d *= 2) {
    auto iters = [&](int base) {
      return static_cast<int>(d <= 256 ? base : std::max<int64_t>(5, base * 256 / d));
    };
    const double a = time_op(d, 1, iters(quick ? 200 : 2000), reps, psum);
    const double k4 = time_op(d, 1024, iters(quick ? 50 : 400), reps, psum);
    const double b = time_op(d, 16 * 1024, iters(quick ? 20 : 100), reps, psum);
    std::printf("| %7lld | %9.1f us | %7.2f us | %14.1f us | %7.2f us | %15.1f us | %7.2f us |\n",
                static_cast<long long>(d), a * 1e6, a * 1e6 / d, k4 * 1e6, k4 * 1e6 / d, b * 1e6,
                b * 1e6 / d);
    std::fflush(stdout);
  }
}

// Issue 28's rows alone, `rounds` times in turn on 8 devices: psum float32 64 MiB/device, bfloat16
// 64 MiB/device (32 Mi elements) and bfloat16 16 Mi elements/device (the float32 row's element
// count), each round's N·P bound from the fastest copy timed so far (copies timed before and after
// every round); then the medians of the per-round ratios.
void psum_dtypes(int rounds, int reps) {
  auto psum = [](Context& c, const Tensor& t) { return c.psum(t, "x"); };
  const int64_t n = 8;
  const size_t big = size_t{64} << 20;
  const int64_t elems = static_cast<int64_t>(big / 4);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf(
      "# psum on %lld devices, float32 vs bfloat16, %d rounds (each: copies, f32 64 MiB, bf16 "
      "64 MiB, bf16 16 Mi elements, copies; medians of %d samples each, and the fastest f32 "
      "sample; the bound's rate is the fastest copy so far: memcpy or in-place pass, over buffers "
      "spanning the psum's 1 GiB)\n",
      static_cast<long long>(n), rounds, reps);
  std::printf(
      "| round | copy rate | f32 64 MiB | / bound | fastest / bound | bf16 64 MiB | / bound | bf16 "
      "16 Mi el. | / f32 64 MiB |\n|---|---|---|---|---|---|---|---|---|\n");
  std::vector<double> r32, b32, r16, rhalf;
  CopyRate rate;
  const auto footprint = static_cast<size_t>(meshrt::bench::psum_traffic(n, big).footprint());
  for (int r = 0; r < rounds; ++r) {
    probe_copies(rate, footprint, cores, reps);
    const std::vector<double> s32 = op_samples(n, elems, 4, reps, psum);
    const double t32 = median(s32);
    const double t16 = time_op(n, elems * 2, 4, reps, psum, DType::bf16);
    const double th = time_op(n, elems, 4, reps, psum, DType::bf16);
    probe_copies(rate, footprint, cores, reps);
    const double bw = rate.best();
    const double bound = rate.seconds(meshrt::bench::psum_traffic(n, big));
    r32.push_back(t32 / bound);
    b32.push_back(*std::min_element(s32.begin(), s32.end()) / bound);
    r16.push_back(t16 / bound);
    rhalf.push_back(th / t32);
    std::printf(
        "| %d | %.2f GB/s | %.1f ms | %.2fx | %.2fx | %.1f ms | %.2fx | %.1f ms | %.2fx |\n", r + 1,
        bw / 1e9, t32 * 1e3, r32.back(), b32.back(), t16 * 1e3, r16.back(), th * 1e3, rhalf.back());
    std::fflush(stdout);
  }
  std::printf("| median | | | %.2fx | %.2fx | | %.2fx | | %.2fx |\n", median(r32), median(b32),
              median(r16), median(rhalf));
}

}  // namespace

// Runs this program again with MESHRT_CPU_EXECUTOR=threads for the small-psum latency alone.
std::pair<double, double> latency_with_threads(const char* self, bool quick) {
  std::string cmd = std::string("MESHRT_CPU_EXECUTOR=threads ") + self + " --latency-only" +
                    (quick ? " --quick" : "");
  FILE* p = popen(cmd.c_str(), "r");
  double med = -1, mean = -1;
  if (p) {
    char line[256];
    while (fgets(line, sizeof line, p)) std::sscanf(line, "latency %lf %lf", &med, &mean);
    pclose(p);
  }
  return {med, mean};
}

const char* executor_name() {
  const char* e = std::getenv("MESHRT_CPU_EXECUTOR");
  return e && *e ? e : "auto";
}

int main(int argc, char** argv) {
  bool quick = false, mpi = true, latency_only = false;
  int psum_dtype_rounds = 0;
  int64_t devices_only = 0;
  const char* usage =
      "usage: meshrt-perf-report [--quick] [--no-mpi] [--psum-dtypes [ROUNDS]] [--devices [MAX]]\n"
      "  (no option)           every row: collectives against their bounds and Open MPI, the\n"
      "                        shard_map call, psum over 8..256 devices\n"
      "  --quick               fewer samples and devices (a smoke run, not for the tables)\n"
      "  --no-mpi              skip the Open MPI baselines\n"
      "  --psum-dtypes [N]     psum float32 and bfloat16 rows alone, N rounds (default 5)\n"
      "  --devices [MAX]       the devices table alone, 8..MAX devices (default 256, MAX <= "
      "4096)\n";
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc && std::isdigit(static_cast<unsigned char>(argv[i + 1][0]));
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--no-mpi") == 0) {
      mpi = false;
    } else if (std::strcmp(argv[i], "--latency-only") == 0) {
      latency_only = true;  // internal: the threads executor's latency row, run as a child
    } else if (std::strcmp(argv[i], "--psum-dtypes") == 0) {
      psum_dtype_rounds = has_value ? std::atoi(argv[++i]) : 5;
    } else if (std::strcmp(argv[i], "--devices") == 0) {
      devices_only = has_value ? std::atoll(argv[++i]) : 256;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(usage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "meshrt-perf-report: unknown argument '%s'\n%s", argv[i], usage);
      return 2;
    }
  }
  if (psum_dtype_rounds < 1 && std::find_if(argv + 1, argv + argc, [](const char* a) {
                                 return std::strcmp(a, "--psum-dtypes") == 0;
                               }) != argv + argc) {
    std::fprintf(stderr, "meshrt-perf-report: --psum-dtypes takes a round count >= 1\n");
    return 2;
  }
  if (psum_dtype_rounds > 0) {
    set_cpu_device_count(8);
    psum_dtypes(psum_dtype_rounds, quick ? 3 : 5);
    return 0;
  }
  if (devices_only > 0) {
    if (devices_only < 8 || devices_only > 4096) {
      std::fprintf(stderr, "meshrt-perf-report: --devices takes 8..4096\n");
      return 2;
    }
    set_cpu_device_count(static_cast<int>(devices_only));
    devices_table(devices_only, quick, quick ? 3 : 7);
    return 0;
  }
  auto psum = [](Context& c, const Tensor& t) { return c.psum(t, "x"); };
  if (latency_only) {
    set_cpu_device_count(8);
    auto [med, mean] = latency_op(8, quick ? 2000 : 20000, quick ? 3 : 7, psum);
    std::printf("latency %.9f %.9f\n", med, mean);
    return 0;
  }
  const int max_devices = quick ? 32 : 256;
  set_cpu_device_count(max_devices);
  const int reps = quick ? 3 : 7;
  const int64_t n = 8;
  const size_t big = size_t{64} << 20, mid = size_t{16} << 20;

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Every bound divides by the fastest copy timed in this run over buffers spanning as many bytes
  // as the row's collective (bench/bounds.h's Traffic::footprint), with copies timed again just
  // before and just after the row (CopyRate): copies within a cache run at the cache's speed (an
  // in-place pass over 2 x 16 MiB fits this VM's 32 MiB L3), and a collective whose buffers span
  // 144 MiB or more cannot, so a rate from smaller copies is no floor for it.
  using meshrt::bench::Traffic;
  const Traffic psum_big = meshrt::bench::psum_traffic(n, big);
  CopyRates rates{cores, reps, {}};
  probe_copies(rates.by_footprint[static_cast<size_t>(psum_big.footprint())],
               static_cast<size_t>(psum_big.footprint()), cores, reps);
  const CopyRate& first = rates.by_footprint[static_cast<size_t>(psum_big.footprint())];
  std::printf(
      "# meshrt performance report: %lld simulated cpu devices on %u hardware threads, "
      "MESHRT_CPU_EXECUTOR=%s (fibers when devices outnumber cores)\n",
      static_cast<long long>(n), std::thread::hardware_concurrency(), executor_name());
  std::printf(
      "# over buffers spanning %.0f MiB (the 64 MiB psum's), one thread and all cores, %d rounds "
      "each: copy rate %.2f GB/s (fastest memcpy or in-place pass, bytes copied), write rate "
      "%.2f GB/s (fastest memset or copy, bytes written), read rate %.2f GB/s (fastest read or "
      "copy, bytes read)\n",
      psum_big.footprint() / (1 << 20), reps, first.best() / 1e9, first.best_write() / 1e9,
      first.best_read() / 1e9);
  std::printf(
      "# each bound below uses the fastest copy timed in this run over buffers spanning as many "
      "bytes as the row's collective, "
      "copies timed again just before and after the row, one thread and all cores (a floor "
      "takes the best rate: this machine's drifts)\n\n");
  std::printf("| %-44s | %13s | %-30s | %13s | %7s | %-10s |\n", "measurement", "meshrt",
              "baseline", "baseline", "ratio", "target");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(46, '-').c_str(), std::string(15, '-').c_str(),
              std::string(32, '-').c_str(), std::string(15, '-').c_str(),
              std::string(9, '-').c_str(), std::string(12, '-').c_str());

  const int64_t big_elems = static_cast<int64_t>(big / 4);
  // Copies timed just before. The median is a typical call against the machine's fastest copy;
  // the fastest call is the machine's best moment against its best moment (on a VM whose
  // neighbours take half its memory bandwidth for seconds at a time, the two differ).
  const std::vector<double> big_samples = op_samples(n, big_elems, quick ? 2 : 4, reps, psum);
  const double t_big = median(big_samples);
  const double big_bound = rates.bound(psum_big);
  row("psum 64 MiB/device, float32", t_big, meshrt::bench::psum_formula(), big_bound, "<= 1.1x");
  row("psum 64 MiB/device, float32: fastest call",
      *std::min_element(big_samples.begin(), big_samples.end()), meshrt::bench::psum_formula(),
      rates.floor(psum_big), "<= 1.1x");
  row("psum 64 MiB/device, float32", t_big, "hand-written psum, all cores",
      hand_psum_seconds(n, big, cores, reps), "<= 1.1x");
  if (mpi) {
    double m = mpi_allreduce(static_cast<int>(n), big, quick ? 2 : 4, quick ? 3 : 5);
    row("psum 64 MiB/device, float32", t_big, "Open MPI MPI_Allreduce 8 ranks", m, "<= 0.33x");
  }
  // bfloat16 (issue 28): the same bound for its bytes, and the same element count as the
  // float32 row in half the bytes (about half the time if the fold keeps up with memory).
  rates.bound(psum_big);  // copies timed just before
  const double t_bf16 = time_op(n, big_elems * 2, quick ? 2 : 4, reps, psum, DType::bf16);
  row("psum 64 MiB/device, bfloat16", t_bf16, meshrt::bench::psum_formula(), rates.bound(psum_big),
      "<= 1.1x");
  const double t_bf16_half = time_op(n, big_elems, quick ? 2 : 4, reps, psum, DType::bf16);
  row("psum 16 Mi elements/device, bfloat16", t_bf16_half, "the float32 row (64 MiB)", t_big,
      "~0.5x");
  auto [t_small, t_small_mean] = latency_op(n, quick ? 2000 : 20000, reps, psum);
  row("psum of one float: median per call", t_small, "std::barrier rendezvous (mean)",
      barrier_psum_latency(static_cast<int>(n), quick ? 2000 : 20000, reps), "< 8 us");
  if (mpi)
    row("psum of one float: median per call", t_small, "Open MPI MPI_Allreduce (mean)",
        mpi_allreduce(static_cast<int>(n), 4, 20000, 5), "< 8 us");
  row("psum of one float: mean per call", t_small_mean, "", -1, "");
  row("whole shard_map call, psum of one float",
      shard_map_call_latency(n, quick ? 1000 : 5000, reps), "the psum alone (median above)",
      t_small, "<= 25 us");
  auto [thr_med, thr_mean] = latency_with_threads(argv[0], quick);
  row("psum of one float: median, threads executor", thr_med, "", -1, "(compare)");
  (void)thr_mean;

  const int64_t mid_elems = static_cast<int64_t>(mid / 4);
  const int it = quick ? 3 : 8;
  const Traffic ag = meshrt::bench::all_gather_traffic(n, mid),
                rs = meshrt::bench::psum_scatter_traffic(n, mid),
                a2a = meshrt::bench::all_to_all_traffic(n, mid),
                pp = meshrt::bench::ppermute_traffic(n, mid);
  rates.bound(ag);  // copies timed just before
  double t_ag = time_op(n, mid_elems / n, it, reps,
                        [](Context& c, const Tensor& t) { return c.all_gather(t, "x", 0, true); });
  row("all_gather 16 MiB output/device", t_ag, meshrt::bench::all_gather_formula(), rates.bound(ag),
      "<= 1.2x");
  double t_rs = time_op(n, mid_elems, it, reps, [](Context& c, const Tensor& t) {
    return c.psum_scatter(t, "x", 0, true);
  });
  row("psum_scatter 16 MiB input/device", t_rs, meshrt::bench::psum_scatter_formula(),
      rates.bound(rs), "<= 1.2x");
  row("psum_scatter 16 MiB input/device", t_rs, "hand-written fold, all cores",
      hand_fold_seconds(n, mid, cores, reps), "<= 1.2x");
  rates.bound(a2a);  // copies timed just before
  double t_a2a = time_op(n, mid_elems, it, reps, [](Context& c, const Tensor& t) {
    return c.all_to_all(t, "x", 0, 0, true);
  });
  row("all_to_all 16 MiB/device", t_a2a, meshrt::bench::all_to_all_formula(), rates.bound(a2a),
      "<= 1.2x");
  rates.bound(pp);  // copies timed just before
  std::vector<std::pair<int64_t, int64_t>> shift;
  for (int64_t i = 0; i < n; ++i) shift.emplace_back(i, (i + 1) % n);
  double t_pp = time_op(n, mid_elems, it, reps,
                        [&](Context& c, const Tensor& t) { return c.ppermute(t, "x", shift); });
  row("ppermute 16 MiB/device (ring shift)", t_pp, meshrt::bench::ppermute_formula(),
      rates.bound(pp), "<= 1.2x");

  devices_table(max_devices, quick, reps);
  return 0;
}
