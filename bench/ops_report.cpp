// meshrt-ops-report: device-local op speed against the libraries underneath, same run.
//   matmul GFLOP/s vs cblas_sgemm called directly (target >= 0.9x)
//   elementwise add bandwidth (2 reads + 1 write) vs memcpy traffic (read + write) (>= 0.7x)
// each on one device and on 8 simulated devices at once (8 host threads calling BLAS directly
// are the 8-device baseline). Medians of repeated runs.
#include <cblas.h>
#include <meshrt/meshrt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "bench/bench_util.h"

using namespace meshrt;
using meshrt::bench::Clock;
using meshrt::bench::median;
using meshrt::bench::seconds_since;
using meshrt::bench::span;
using meshrt::bench::time_threads;

namespace {

// Median seconds of fn over reps, after one warm-up call.
double timeit(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    s.push_back(seconds_since(t0));
  }
  return median(s);
}

// Median seconds for every device of a mesh to run fn on its own block once.
double timeit_devices(const Mesh& mesh, int reps, const std::function<void(Context&)>& fn) {
  std::vector<double> s;
  std::vector<Clock::time_point> start(static_cast<size_t>(mesh.size())),
      end(static_cast<size_t>(mesh.size()));
  Array x = device_put(std::vector<float>(static_cast<size_t>(mesh.size()), 0.f), {mesh.size()},
                       NamedSharding(mesh, P("x")));
  shard_map(
      [&](Context& ctx, const Tensor& t) {
        Tensor one = tensor(std::vector<float>{1.f}, {1}, ctx.device());
        fn(ctx);  // warm-up
        const auto me = static_cast<size_t>(ctx.axis_index("x"));
        for (int r = 0; r < reps; ++r) {
          ctx.psum(one, "x");
          start[me] = Clock::now();  // each device's own: a device may start before device 0
          fn(ctx);
          end[me] = Clock::now();
          ctx.psum(one, "x");  // every device done (and its times written)
          if (me == 0) s.push_back(span(start, end));
        }
        return t;
      },
      mesh, {P("x")}, P("x"))(x);
  return median(s);
}

void row(const char* what, double mine, double base, const char* unit, const char* target) {
  std::printf("| %-40s | %9.2f %-5s | %9.2f %-5s | %6.2fx | %-7s |\n", what, mine, unit, base, unit,
              mine / base, target);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int reps = quick ? 3 : 7;
  set_cpu_device_count(8);
  Device d0 = devices("cpu")[0];
  Mesh mesh = make_mesh({8}, {"x"});
  std::printf(
      "# meshrt ops report: 8 simulated cpu devices on %u hardware threads; BLAS single-threaded "
      "per call "
      "when devices >= cores (both sides)\n\n",
      std::thread::hardware_concurrency());
  if (const char* core = std::getenv("OPENBLAS_CORETYPE"); core != nullptr) {
    std::printf("# OPENBLAS_CORETYPE=%s is set: OpenBLAS runs those kernels on both sides\n\n",
                core);
  }
  std::printf("| %-40s | %15s | %15s | %7s | %-7s |\n|%s|%s|%s|%s|%s|\n", "measurement", "meshrt",
              "baseline", "ratio", "target", std::string(42, '-').c_str(),
              std::string(17, '-').c_str(), std::string(17, '-').c_str(),
              std::string(9, '-').c_str(), std::string(9, '-').c_str());

  // ---- matmul, one device: meshrt::matmul vs cblas_sgemm on the same sizes.
  const int64_t n1 = quick ? 512 : 1024;
  Tensor a = random::normal(random::key(1), {n1, n1}, d0),
         b = random::normal(random::key(2), {n1, n1}, d0);
  std::vector<float> ha = a.to_vector<float>(), hb = b.to_vector<float>(),
                     hc(static_cast<size_t>(n1 * n1));
  const double flops1 = 2.0 * n1 * n1 * n1;
  double t_mine = timeit(reps, [&] { matmul(a, b).block_until_ready(); });
  double t_blas = timeit(reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n1),
                static_cast<int>(n1), static_cast<int>(n1), 1.f, ha.data(), static_cast<int>(n1),
                hb.data(), static_cast<int>(n1), 0.f, hc.data(), static_cast<int>(n1));
  });
  char label[96];
  std::snprintf(label, sizeof label, "matmul f32 %lldx%lldx%lld, 1 device", (long long)n1,
                (long long)n1, (long long)n1);
  row(label, flops1 / t_mine / 1e9, flops1 / t_blas / 1e9, "GF/s", ">= 0.9x");

  // ---- matmul, 8 devices at once (each its own matrices) vs 8 threads calling BLAS.
  const int64_t n8 = quick ? 256 : 512;
  const double flops8 = 8 * 2.0 * n8 * n8 * n8;
  std::vector<std::vector<float>> A(8), B(8), C(8);
  for (int i = 0; i < 8; ++i) {
    A[static_cast<size_t>(i)].assign(static_cast<size_t>(n8 * n8), 0.5f);
    B[static_cast<size_t>(i)].assign(static_cast<size_t>(n8 * n8), 0.25f);
    C[static_cast<size_t>(i)].resize(static_cast<size_t>(n8 * n8));
  }
  std::vector<Tensor> mx(8), my(8);  // each device's operands, made on first use by that device
  double t_mine8 = timeit_devices(mesh, reps, [&](Context& ctx) {
    const auto i = static_cast<size_t>(ctx.axis_index("x"));
    if (!mx[i].valid()) {
      mx[i] = full({n8, n8}, 0.5, DType::f32, ctx.device());
      my[i] = full({n8, n8}, 0.25, DType::f32, ctx.device());
    }
    matmul(mx[i], my[i]).block_until_ready();
  });
  double t_blas8 = time_threads(8, reps, /*warmup=*/1, [&](int i) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n8),
                static_cast<int>(n8), static_cast<int>(n8), 1.f, A[static_cast<size_t>(i)].data(),
                static_cast<int>(n8), B[static_cast<size_t>(i)].data(), static_cast<int>(n8), 0.f,
                C[static_cast<size_t>(i)].data(), static_cast<int>(n8));
  });
  std::snprintf(label, sizeof label, "matmul f32 %lld^3 on each of 8 devices", (long long)n8);
  row(label, flops8 / t_mine8 / 1e9, flops8 / t_blas8 / 1e9, "GF/s", ">= 0.9x");

  // ---- elementwise add vs memcpy traffic.
  const int64_t ne = int64_t{1} << (quick ? 22 : 24);
  Tensor x = full({ne}, 1.0, DType::f32, d0), y = full({ne}, 2.0, DType::f32, d0);
  std::vector<char> src(static_cast<size_t>(ne * 4), 1), dst(static_cast<size_t>(ne * 4));
  double t_add = timeit(reps, [&] { add(x, y).block_until_ready(); });
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double t_cpy = time_threads(cores, reps, /*warmup=*/1, [&](int i) {
    const size_t part = src.size() / static_cast<size_t>(cores);
    std::memcpy(dst.data() + part * static_cast<size_t>(i),
                src.data() + part * static_cast<size_t>(i), part);
  });
  const double add_bw = 3.0 * 4 * ne / t_add / 1e9, cpy_bw = 2.0 * 4 * ne / t_cpy / 1e9;
  std::snprintf(label, sizeof label, "add f32, %lld M elements, 1 device", (long long)(ne >> 20));
  row(label, add_bw, cpy_bw, "GB/s", ">= 0.7x");

  const int64_t ne8 = ne / 8;
  std::vector<Tensor> xs(8), ys(8);
  double t_add8 = timeit_devices(mesh, reps, [&](Context& ctx) {
    const auto i = static_cast<size_t>(ctx.axis_index("x"));
    if (!xs[i].valid()) {
      xs[i] = full({ne8}, 1.0, DType::f32, ctx.device());
      ys[i] = full({ne8}, 2.0, DType::f32, ctx.device());
    }
    add(xs[i], ys[i]).block_until_ready();
  });
  std::snprintf(label, sizeof label, "add f32, %lld M elements over 8 devices",
                (long long)(ne >> 20));
  row(label, 3.0 * 4 * ne / t_add8 / 1e9, cpy_bw, "GB/s", ">= 0.7x");
  return 0;
}
