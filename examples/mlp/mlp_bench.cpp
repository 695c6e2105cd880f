// meshrt-mlp-bench: one loss-and-grad step of the seed MLP, its gradient taken by value_and_grad
// (global-view ops, shard_map) and by the hand-written backward pass, side by side in one run:
// median time, peak device memory of the step, and the compute bound (the step's FLOPs at the
// sgemm rate measured here, in the same run).
//
//   MESHRT_CPU_DEVICES=8 build/examples/meshrt-mlp-bench [--quick] [--repeats N]
//                         [--resident-only] [--strategy single|dp|fsdp|tp|2d]
//                         [--dtype f32|bf16] [--jax bench/jax_mlp_step.py]
// --resident-only runs only the last table (the device-resident step); --strategy only that row;
// --dtype bf16 runs that table in mixed precision (mlp::Precision::bf16: float32 master
// parameters, bfloat16 layers), its bound the step's FLOPs at the bfloat16 matmul rate measured
// in the same run; --jax runs JAX's jitted float32 step of the same model and strategies (the
// script given, with python3) right after, in the same run, when JAX is installed.
#include <meshrt/meshrt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "examples/mlp/mlp.h"

using namespace meshrt;
using mlp::Strategy;
using mlp::Style;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, resident_only = false;
  int repeats = 5;
  std::string only, jax_script, dtype_arg = "f32";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "MESHRT_CPU_DEVICES=8 meshrt-mlp-bench [--quick] [--repeats N] [--resident-only]\n"
          "                 [--strategy single|dp|fsdp|tp|2d] [--dtype f32|bf16]\n"
          "                 [--jax bench/jax_mlp_step.py]\n"
          "The seed MLP's loss-and-gradient step per strategy against the matmul bound, on 2, 4\n"
          "or 8 devices (MESHRT_CPU_DEVICES). --dtype bf16: the device-resident step in mixed\n"
          "precision (float32 master parameters, bfloat16 layers) against the bfloat16 matmul\n"
          "rate measured in the same run.\n");
      return 0;
    }
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--resident-only") == 0) resident_only = true;
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) repeats = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--strategy") == 0 && i + 1 < argc) only = argv[++i];
    if (std::strcmp(argv[i], "--jax") == 0 && i + 1 < argc) jax_script = argv[++i];
    if (std::strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) dtype_arg = argv[++i];
  }
  if (dtype_arg != "f32" && dtype_arg != "bf16") {
    std::fprintf(stderr, "meshrt-mlp-bench: --dtype takes f32 or bf16, not '%s'\n",
                 dtype_arg.c_str());
    return 2;
  }
  const mlp::Precision precision = dtype_arg == "bf16" ? mlp::Precision::bf16 : mlp::Precision::f32;
  const DType compute = precision == mlp::Precision::bf16 ? DType::bf16 : DType::f32;
  // The hand-written backward pass is float32 only: mixed precision runs the resident table.
  if (precision != mlp::Precision::f32) resident_only = true;
  if (repeats < 1) {
    std::fprintf(stderr, "meshrt-mlp-bench: --repeats takes a whole number >= 1\n");
    return 2;
  }
  const std::vector<std::string> short_names{"single", "dp", "fsdp", "tp", "2d"};
  if (!only.empty() &&
      std::find(short_names.begin(), short_names.end(), only) == short_names.end()) {
    std::fprintf(stderr,
                 "meshrt-mlp-bench: --strategy takes single, dp, fsdp, tp or 2d, not '%s'\n",
                 only.c_str());
    return 2;
  }
  const int64_t batch = quick ? 512 : 8192, hidden = quick ? 256 : 1024;
  const std::vector<int64_t> sizes{784, hidden, hidden, hidden, hidden, hidden, 8};
  const int64_t n = static_cast<int64_t>(devices().size());
  // Every strategy must split the model evenly: FSDP shards the last layer's 8 outputs, the 2-D
  // mesh is (devices / 2, 2).
  if (n < 2 || 8 % n != 0) {
    std::fprintf(stderr,
                 "meshrt-mlp-bench: runs on 2, 4 or 8 devices (FSDP shards the last layer's 8 "
                 "outputs; the 2-D mesh is (devices/2, 2)); this process has %lld: set "
                 "MESHRT_CPU_DEVICES=8\n",
                 static_cast<long long>(n));
    return 2;
  }
  Mesh mesh = make_mesh({n}, {"batch"});
  mlp::Problem p = mlp::init(random::key(0), sizes, batch);

  const double flops = mlp::step_flops(sizes, batch);
  // The rate the bound uses: on cpu the devices share the machine's cores, so all of them
  // multiplying their own blocks at once; on a device platform whose logical devices share one
  // GPU, that GPU's rate on the whole (batch, hidden) x (hidden, hidden) product from one device
  // (8 logical devices' smaller products run below it, which made a bound the step beat).
  const bool shared_cores = std::string(devices().front().platform()) == "cpu";
  const Mesh rate_mesh = shared_cores ? mesh : Mesh({mesh.devices().front()}, {1}, {"batch"});
  const double rate = mlp::matmul_gflops(rate_mesh, batch, hidden, hidden, repeats, compute);
  std::printf(
      "MLP [784, %lld x 5, 8], batch %lld, %s, %lld %s devices, matmul precision %s; %d "
      "repeats, medians, every step timed to completion (block_until_ready)\n",
      static_cast<long long>(hidden), static_cast<long long>(batch),
      precision == mlp::Precision::f32
          ? "float32"
          : "bf16 mixed precision (float32 master parameters, bfloat16 layers, float32 loss)",
      static_cast<long long>(n), std::string(devices().front().platform()).c_str(),
      std::string(precision_name(default_matmul_precision())).c_str(), repeats);
  std::printf("%s, %s (%lld x %lld x %lld): %.1f GFLOP/s; the step is %.1f GFLOP\n",
              precision == mlp::Precision::f32 ? "sgemm" : "bfloat16 matmul",
              shared_cores ? "all devices at once" : "one device, the whole product",
              static_cast<long long>(batch), static_cast<long long>(hidden),
              static_cast<long long>(hidden), rate, flops / 1e9);
  // OpenBLAS's kernel set decides the bound: say when the environment chose it.
  if (const char* core = std::getenv("OPENBLAS_CORETYPE"); core != nullptr) {
    std::printf(
        "OPENBLAS_CORETYPE=%s is set: OpenBLAS runs those kernels, not the ones it would "
        "pick for this CPU\n",
        core);
  }
  if (!resident_only) {
    std::printf("%-16s %-30s %10s %9s %12s %9s\n", "strategy", "gradient", "time", "vs hand",
                "peak memory", "vs hand");
  }
  for (Strategy s : {Strategy::data_parallel, Strategy::fsdp}) {
    if (resident_only) break;
    double hand_t = 0, hand_m = 0;
    for (Style style : {Style::hand_written, Style::global_view, Style::shard_map}) {
      (void)mlp::loss_and_grad(p, s, mesh, style);  // warm-up
      std::vector<double> t;
      int64_t peak = 0;
      for (int r = 0; r < repeats; ++r) {
        const int64_t base = memory_stats().bytes_in_use;
        reset_peak_memory_stats();
        auto t0 = std::chrono::steady_clock::now();
        (void)mlp::loss_and_grad(p, s, mesh, style);
        t.push_back(seconds_since(t0));
        peak = std::max(peak, memory_stats().peak_bytes_in_use - base);
      }
      const double tm = median(t);
      if (style == Style::hand_written) {
        hand_t = tm;
        hand_m = static_cast<double>(peak);
      }
      std::printf("%-16s %-30s %8.1f ms %8.2fx %9.1f MiB %8.2fx\n", mlp::name(s), mlp::name(style),
                  tm * 1e3, tm / hand_t, static_cast<double>(peak) / (1 << 20),
                  static_cast<double>(peak) / hand_m);
    }
  }
  // One device of the same 8: it alone is busy, and should use every core (the hand-written
  // step, against the 8-device data-parallel one above).
  if (!resident_only) {
    const Mesh one({mesh.devices().front()}, {1}, {"batch"});
    (void)mlp::loss_and_grad(p, Strategy::single, one, Style::hand_written);  // warm-up
    std::vector<double> t, dp;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      (void)mlp::loss_and_grad(p, Strategy::single, one, Style::hand_written);
      t.push_back(seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      (void)mlp::loss_and_grad(p, Strategy::data_parallel, mesh, Style::hand_written);
      dp.push_back(seconds_since(t0));
    }
    std::printf("%-16s %-30s %8.1f ms %8.2fx of the data-parallel step (%.1f ms, interleaved)\n",
                "single device", "hand-written", median(t) * 1e3, median(t) / median(dp),
                median(dp) * 1e3);
  }
  // The devices share this machine's cores: the bound is the step's FLOPs at the rate the
  // devices' sgemms reach together here.
  const double bound = flops / (rate * 1e9);
  std::printf("compute bound: %.1f GFLOP / %.1f GFLOP/s = %.1f ms\n", flops / 1e9, rate,
              bound * 1e3);

  // The training step as a training loop runs it: parameters and batch placed once, the step
  // value_and_grad of the global-view loss, eager and jitted (interleaved), results left on the
  // devices.
  std::printf(
      "\ndevice-resident step, value_and_grad of the global-view loss (no host copies), %s:\n",
      mlp::name(precision));
  std::printf("%-16s %10s %10s %9s %12s\n", "strategy", "eager", "jit", "jit/eager", "jit/bound");
  const Mesh mesh2 = make_mesh({n / 2, 2}, {"batch", "model"});
  for (Strategy s : {Strategy::single, Strategy::data_parallel, Strategy::fsdp,
                     Strategy::tensor_parallel, Strategy::data_tensor_2d}) {
    if (!only.empty() && only != short_names[static_cast<size_t>(s)]) continue;
    const Mesh m = s == Strategy::single           ? Mesh({mesh.devices().front()}, {1}, {"batch"})
                   : s == Strategy::data_tensor_2d ? mesh2
                                                   : mesh;
    const mlp::Placement at = mlp::placement(s, m);
    const mlp::Params params = mlp::device_put_params(p, s, m);
    const Array x = device_put(p.x, {p.batch, p.sizes.front()}, NamedSharding(m, at.x));
    const Array y = device_put(p.y, {p.batch, p.sizes.back()}, NamedSharding(m, at.x));
    auto eager = value_and_grad(mlp::Loss{precision});
    auto jitted = jit(value_and_grad(mlp::Loss{precision}));
    block_until_ready(eager(params, x, y));   // warm-up
    block_until_ready(jitted(params, x, y));  // traced
    // This machine's speed drifts: the bound is measured again next to every jitted step, and
    // the ratio is the median of the per-repeat ratios.
    std::vector<double> te, tj, ratio;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      block_until_ready(eager(params, x, y));
      te.push_back(seconds_since(t0));
      const double bound_now =
          flops / (mlp::matmul_gflops(rate_mesh, batch, hidden, hidden, 1, compute) * 1e9);
      t0 = std::chrono::steady_clock::now();
      block_until_ready(jitted(params, x, y));
      tj.push_back(seconds_since(t0));
      ratio.push_back(tj.back() / bound_now);
    }
    std::printf("%-16s %7.1f ms %7.1f ms %8.2fx %11.2fx\n", mlp::name(s), median(te) * 1e3,
                median(tj) * 1e3, median(tj) / median(te), median(ratio));
  }
  if (!jax_script.empty() && precision != mlp::Precision::f32) {
    std::printf("\n--jax runs JAX's float32 step: skipped with --dtype %s\n", dtype_arg.c_str());
  } else if (!jax_script.empty()) {
    std::printf("\nJAX, the same step (jax.jit(jax.value_and_grad(loss)), %s):\n",
                jax_script.c_str());
    std::fflush(stdout);
    if (std::system("python3 -c 'import jax' >/dev/null 2>&1") != 0) {
      std::printf("JAX is not installed (pip install jax): skipped\n");
    } else {
      std::string cmd = "python3 '" + jax_script + "' --repeats " + std::to_string(repeats);
      if (quick) cmd += " --quick";
      if (!only.empty()) cmd += " --strategy " + only;
      if (std::system(cmd.c_str()) != 0) std::printf("the JAX script failed\n");
    }
  }
  return 0;
}
