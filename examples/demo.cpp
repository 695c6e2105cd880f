// meshrt walkthrough: devices, meshes, shardings, where the blocks went, and resharding.
// Run it with ./run.sh demo (8 simulated cpu devices).
#include <meshrt/meshrt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "examples/mlp/mlp.h"

using namespace meshrt;

#include "examples/jit_demo.h"  // NOLINT(build/include_order): uses the names above

namespace {

std::string range_str(const Index& idx) {
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(idx[d].first) + ":" + std::to_string(idx[d].second);
  }
  return s + "]";
}

// How many float32 values lie between a and b (0: equal, +0 and -0 too; huge for NaN).
uint64_t ulps_apart(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return UINT64_MAX;
  auto line = [](float f) {  // sign-magnitude bits onto a line where neighbours differ by one
    uint32_t u = 0;
    std::memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) != 0 ? 0x80000000u - (u & 0x7fffffffu) : 0x80000000u + u;
  };
  const uint32_t x = line(a), y = line(b);
  return x > y ? x - y : y - x;
}

std::string values_str(const Tensor& t) {
  std::vector<int32_t> v = t.to_vector<int32_t>();
  if (t.ndim() != 2) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
    return "[" + s + "]";
  }
  int64_t cols = t.shape()[1];
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (cols > 0 && i % static_cast<size_t>(cols) == 0)
      s += i ? "] [" : "[";
    else
      s += " ";
    s += std::to_string(v[i]);
  }
  return "[" + s + "]]";
}

void show(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape) {
  std::vector<int32_t> host(static_cast<size_t>(shape_size(shape)));
  std::iota(host.begin(), host.end(), 0);
  Array x = device_put(host, shape, NamedSharding(mesh, spec));
  std::printf("-- %s, %s, arange(%lld).reshape%s: block %s\n", mesh.str().c_str(),
              spec.str().c_str(), static_cast<long long>(x.size()), shape_str(shape).c_str(),
              shape_str(x.sharding().shard_shape(shape)).c_str());
  std::printf("%s", visualize_sharding(x).c_str());
  for (const Shard& s : x.addressable_shards()) {
    std::printf("   %-6s %-14s %s\n", s.device.str().c_str(), range_str(s.index).c_str(),
                values_str(s.data).c_str());
  }
  std::printf("\n");
}

// Where parts 1-3 run: --platform=cpu (default) or --platform=cuda.
std::string g_platform = "cpu";

// Host reference helpers for part 2.
std::vector<int32_t> iota(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

void report(const char* title, const Array& y, const std::vector<int32_t>& want) {
  bool ok = y.to_vector<int32_t>() == want;
  std::printf("-- %s -> %s %s: %s\n", title, shape_str(y.shape()).c_str(),
              y.sharding().str().c_str(), ok ? "matches the host computation" : "MISMATCH");
  for (const Shard& s : y.addressable_shards()) {
    std::printf("   %-6s %s\n", s.device.str().c_str(), values_str(s.data).c_str());
  }
  std::printf("\n");
  if (!ok) std::exit(1);
}

// Part 3: the seed programs.
void part3(bool quick) {
  using collective_matmul::Variant;
  std::printf(
      "== Part 3: seed programs\n\n-- Collective matmul, lhs (48, 80) @ rhs (80, 7), float32, vs "
      "the host product\n");
  std::printf("   %-24s %-14s %8s %8s %8s\n", "program", "variant", "2 dev", "4 dev", "8 dev");
  Device d0 = devices(g_platform)[0];
  const int64_t m = 48, k = 80, n = 7;
  std::vector<double> a = random::normal_values(random::key(1), {m, k}, DType::f32);
  std::vector<double> b = random::normal_values(random::key(2), {k, n}, DType::f32);
  std::vector<double> want(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t q = 0; q < k; ++q)
      for (int64_t j = 0; j < n; ++j)
        want[static_cast<size_t>(i * n + j)] +=
            a[static_cast<size_t>(i * k + q)] * b[static_cast<size_t>(q * n + j)];
  Array A = device_put(std::vector<float>(a.begin(), a.end()), {m, k}, SingleDeviceSharding(d0));
  Array B = device_put(std::vector<float>(b.begin(), b.end()), {k, n}, SingleDeviceSharding(d0));
  for (bool rs : {false, true}) {
    for (Variant v : {Variant::naive, Variant::overlapped, Variant::bidirectional}) {
      std::printf("   %-24s %-14s", rs ? "matmul + reduce_scatter" : "all_gather + matmul",
                  collective_matmul::variant_name(v));
      for (int64_t nd : {2, 4, 8}) {
        Mesh mesh = make_mesh({nd}, {"i"}, g_platform);
        Array c = rs ? collective_matmul::matmul_reduce_scatter(A, B, mesh, "i", v)
                     : collective_matmul::allgather_matmul(A, B, mesh, "i", v);
        double err = 0;
        std::vector<float> got = c.to_vector<float>();
        for (size_t e = 0; e < got.size(); ++e)
          err = std::max(err, std::fabs(got[e] - want[e]) / (1 + std::fabs(want[e])));
        std::printf(" %8s", err < 1e-4 ? "ok" : "MISMATCH");
        if (err >= 1e-4) std::exit(1);
      }
      std::printf("\n");
    }
  }

  std::printf(
      "\n-- MLP [784, 128 x 5, 8], batch 32, init as JAX's tutorial; loss and every gradient vs "
      "one device\n");
  const std::vector<int64_t> sizes{784, 128, 128, 128, 128, 128, 8};
  using mlp::Strategy;
  struct Run {
    Strategy s;
    Mesh mesh;
  };
  const std::vector<Run> runs = {
      {Strategy::single, make_mesh({1}, {"x"}, g_platform)},
      {Strategy::data_parallel, make_mesh({8}, {"batch"}, g_platform)},
      {Strategy::fsdp, make_mesh({8}, {"batch"}, g_platform)},
      {Strategy::tensor_parallel, make_mesh({8}, {"feats"}, g_platform)},
      {Strategy::data_tensor_2d, make_mesh({4, 2}, {"batch", "feats"}, g_platform)}};
  std::printf("   %-22s %-10s %-28s %-28s %s\n", "strategy", "mesh", "loss, 3 SGD steps (current)",
              "loss, 3 SGD steps (legacy)", "max rel diff");
  for (const Run& r : runs) {
    std::string losses[2];
    double worst = 0;
    for (int st = 0; st < 2; ++st) {
      const random::Stream stream = st == 0 ? random::Stream::current : random::Stream::legacy;
      mlp::Problem p = mlp::init(random::key(0, stream), sizes, 32), ref = p;
      for (int step = 0; step < 3; ++step) {
        mlp::Grads g = mlp::loss_and_grad(p, r.s, r.mesh);
        mlp::Grads g1 = mlp::loss_and_grad(ref, Strategy::single, runs[0].mesh);
        worst = std::max(worst, mlp::max_rel_diff(g, g1));
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.4f", step ? " " : "", g.loss);
        losses[st] += buf;
        mlp::sgd_step(p, g, 0.001f);
        mlp::sgd_step(ref, g1, 0.001f);
      }
    }
    std::printf("   %-22s %-10s %-28s %-28s %.1e %s\n", mlp::name(r.s),
                shape_str(r.mesh.shape()).c_str(), losses[0].c_str(), losses[1].c_str(), worst,
                worst < 2e-4 ? "ok" : "MISMATCH");
    if (worst >= 2e-4) std::exit(1);
  }

  const int64_t batch = quick ? 512 : 8192, hidden = quick ? 256 : 1024;
  std::printf(
      "\n-- Timing: one loss-and-grad step, MLP [784, %lld x 5, 8], batch %lld (%%timeit-style: "
      "best of 3; each step places the parameters and the batch and reads the gradients back)\n",
      static_cast<long long>(hidden), static_cast<long long>(batch));
  const std::vector<int64_t> big{784, hidden, hidden, hidden, hidden, hidden, 8};
  mlp::Problem p = mlp::init(random::key(0), big, batch);
  // The compute bound: the step's FLOPs at the rate this machine's matmul reaches with every
  // device multiplying its block at once (the 8 devices share its cores), timed again right
  // after each strategy's steps; each row divides by the fastest rate seen so far.
  const double flops = mlp::step_flops(big, batch);
  const Mesh& all = runs[1].mesh;
  double rate = mlp::matmul_gflops(all, batch, hidden, hidden, 3);
  double t_single = 0;
  std::printf("   %-22s %-10s %10s %9s %9s\n", "strategy", "mesh", "time", "speedup", "/ bound");
  for (const Run& r : runs) {
    double best = 1e300;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      mlp::loss_and_grad(p, r.s, r.mesh);
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    rate = std::max(rate, mlp::matmul_gflops(all, batch, hidden, hidden, 3));
    if (r.s == Strategy::single) t_single = best;
    std::printf("   %-22s %-10s %8.1f ms %8.2fx %8.2fx\n", mlp::name(r.s),
                shape_str(r.mesh.shape()).c_str(), best * 1e3, t_single / best,
                best / (flops / (rate * 1e9)));
  }
  std::printf(
      "   (8 simulated devices share this machine's %u cores; a device alone uses all of them;\n"
      "    bound: %.1f GFLOP at %.1f GFLOP/s, the fastest sgemm rate of all devices at once "
      "measured here = %.1f ms)\n\n",
      std::thread::hardware_concurrency(), flops / 1e9, rate, flops / (rate * 1e9) * 1e3);
}

// Part 2: shard_map bodies and the collectives, on a (4, 2) mesh and an (8, 4) arange.
void part2() {
  std::printf("== Part 2: shard_map and collectives on Mesh('data': 4, 'model': 2)\n\n");
  Mesh mesh = make_mesh({4, 2}, {"data", "model"}, g_platform);
  const std::vector<int32_t> host = iota(32);
  Array x = device_put(host, {8, 4}, NamedSharding(mesh, P("data", "model")));
  std::printf("x = arange(32).reshape(8, 4), sharded P('data', 'model'):\n%s\n",
              visualize_sharding(x).c_str());

  // Elementwise: each device maps its own (2, 2) block; no communication.
  Array y = shard_map(
      [](Context& ctx, const Tensor& b) {
        std::vector<int32_t> v = b.to_vector<int32_t>();
        for (int32_t& e : v) e = 2 * e + 1;
        return tensor(v, b.shape(), ctx.device());
      },
      mesh, {P("data", "model")}, P("data", "model"))(x);
  std::vector<int32_t> want(host);
  for (int32_t& e : want) e = 2 * e + 1;
  report("2*x + 1 (elementwise, per block)", y, want);

  // Sum: each device sums its block, psum over both axes gives every device the total.
  Array total = shard_map(
      [](Context& ctx, const Tensor& b) {
        std::vector<int32_t> v = b.to_vector<int32_t>();
        int32_t s = std::accumulate(v.begin(), v.end(), 0);
        return ctx.psum(tensor(std::vector<int32_t>{s}, {1}, ctx.device()), {"data", "model"});
      },
      mesh, {P("data", "model")}, P())(x);
  report("sum(x) via local sum + psum over ('data', 'model'), out_specs P()", total,
         {std::accumulate(host.begin(), host.end(), 0)});

  // all_gather over 'model' (tiled, axis 1): every device ends with its full rows.
  Array rows =
      shard_map([](Context& ctx, const Tensor& b) { return ctx.all_gather(b, "model", 1, true); },
                mesh, {P("data", "model")}, P("data", None))(x);
  std::printf(
      "all_gather(x, 'model', axis=1, tiled=True): blocks (2, 2) -> (2, 4), out_specs P('data', "
      "None):\n%s",
      visualize_sharding(rows).c_str());
  report("all_gather over 'model'", rows, host);

  // psum_scatter over 'data' (tiled): device (d, m) holds 4 values of the flat arange; the 4
  // devices of a 'data' group sum their vectors and device d keeps element d of the sum.
  Array flat = device_put(host, {32}, NamedSharding(mesh, P(Axes{"data", "model"})));
  Array scattered =
      shard_map([](Context& ctx, const Tensor& b) { return ctx.psum_scatter(b, "data", 0, true); },
                mesh, {P(Axes{"data", "model"})}, P(Axes{"data", "model"}))(flat);
  std::vector<int32_t> sc_want(8);
  for (int d = 0; d < 4; ++d) {
    for (int m = 0; m < 2; ++m) {
      int s = 0;
      for (int k = 0; k < 4; ++k) s += host[static_cast<size_t>((k * 2 + m) * 4 + d)];
      sc_want[static_cast<size_t>(d * 2 + m)] = s;
    }
  }
  report("psum_scatter(v, 'data', tiled=True) of each device's 4 values", scattered, sc_want);

  // ppermute over 'data': a ring shift, block i goes to device i+1.
  Array shifted = shard_map(
      [](Context& ctx, const Tensor& b) {
        return ctx.ppermute(b, "data", {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
      },
      mesh, {P("data", "model")}, P("data", "model"))(x);
  std::vector<int32_t> sh_want(32);
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 4; ++c)
      sh_want[static_cast<size_t>(r * 4 + c)] = host[static_cast<size_t>(((r + 6) % 8) * 4 + c)];
  }
  report("ppermute(x, 'data', ring shift +1)", shifted, sh_want);

  // all_to_all over 'model' (tiled, split columns, concat rows): a blocked transpose.
  Array a2a = shard_map(
      [](Context& ctx, const Tensor& b) { return ctx.all_to_all(b, "model", 1, 0, true); }, mesh,
      {P("data", "model")}, P("data", "model"))(x);
  // Device (d, m) holds B(d, m) = x[2d:2d+2, 2m:2m+2]; it splits its columns in 2 and sends column
  // j to model=j; device (d, m) stacks the column m of B(d, 0) and B(d, 1) as its 4 rows.
  std::vector<int32_t> a2a_want(
      32);  // global (16, 2): device (d, m) holds rows [4d, 4d+4), column m
  for (int d = 0; d < 4; ++d) {
    for (int m = 0; m < 2; ++m) {
      for (int j = 0; j < 2; ++j) {
        for (int r = 0; r < 2; ++r) {
          a2a_want[static_cast<size_t>((4 * d + 2 * j + r) * 2 + m)] =
              host[static_cast<size_t>((2 * d + r) * 4 + 2 * j + m)];
        }
      }
    }
  }
  report("all_to_all(x, 'model', split_axis=1, concat_axis=0, tiled=True)", a2a, a2a_want);
}

}  // namespace

// Part 4: explicit moves between platforms, and a collective on the GPU.
void part4() {
  std::printf("== Part 4: cpu -> cuda -> cpu\n\n");
  const auto ps = platforms();
  if (std::find(ps.begin(), ps.end(), "cuda") == ps.end()) {
    try {
      devices("cuda");
    } catch (const Error& e) {
      std::printf("   skipped, cuda is not usable here: %s\n\n", e.what());
    }
    return;
  }
  const int64_t n = static_cast<int64_t>(devices("cuda").size());
  Mesh cpu_mesh = make_mesh({1}, {"x"}, "cpu");
  Mesh gpu_mesh = make_mesh({n}, {"x"}, "cuda");
  std::vector<float> host(static_cast<size_t>(4 * n));
  std::iota(host.begin(), host.end(), 0.0f);
  Array on_cpu = device_put(host, {4 * n}, NamedSharding(cpu_mesh, P()));
  Array on_gpu = device_put(on_cpu, NamedSharding(gpu_mesh, P("x")));
  std::printf("   %lld cuda devices; x on cpu -> %s\n%s", static_cast<long long>(n),
              on_gpu.sharding().str().c_str(), visualize_sharding(on_gpu).c_str());
  Array summed =
      shard_map([](Context& c, const Tensor& t) { return c.psum(multiply(t, 2.0), "x"); }, gpu_mesh,
                {P("x")}, P())(on_gpu);
  Array back = device_put(summed, NamedSharding(cpu_mesh, P()));
  std::vector<float> want(4, 0.0f);
  for (size_t i = 0; i < host.size(); ++i) want[i % 4] += 2 * host[i];
  std::printf("   psum(2*x) on cuda, moved back to cpu: %s\n",
              back.to_vector<float>() == want ? "ok" : "MISMATCH");
  try {
    shard_map([](Context&, const Tensor& t) { return t; }, gpu_mesh, {P("x")}, P("x"))(on_cpu);
  } catch (const Error& e) {
    std::printf("   a cpu array passed to a cuda shard_map is refused:\n     %s\n\n", e.what());
  }
}

// Part 5: the global view (JAX's automatic parallelism) on 3 devices: ordinary ops on sharded
// Arrays, the shardings they give, and every collective the runtime inserted.
void part5() {
  std::printf("== Part 5: global view on Mesh('x': 3): arange(24).reshape(3, 8) on P('x')\n\n");
  Mesh mesh = make_mesh({3}, {"x"}, g_platform);
  auto iota = [&](Shape shape) {
    std::vector<float> h(static_cast<size_t>(shape_size(shape)));
    std::iota(h.begin(), h.end(), 0.0f);
    return device_put(h, shape, NamedSharding(mesh, P("x")));
  };
  Array x = iota({3, 8});
  auto step = [](const char* what, const Array& r, CollectiveLog& log) {
    std::printf("-- %s -> %s\n%s", what, r.sharding().spec_or_empty().str().c_str(),
                visualize_sharding(r).c_str());
    std::printf("   collectives inserted: %s\n", log.size() == 0 ? "none" : "");
    if (log.size() > 0) std::printf("%s", log.str().c_str());
    std::printf("\n");
    log.clear();
  };
  CollectiveLog log;
  auto on = log.record();
  Array s = sin(x);
  Array y = 2.0 * s + 1.0;
  step("y = 2 * sin(x) + 1", y, log);
  // sin within 2 ulp of the correctly rounded value (a GPU's sinf may differ from glibc's by an
  // ulp); * and + are exact ops, so y is exactly 2 * s + 1 on the sines the platform computed.
  const std::vector<float> sv = s.to_vector<float>();
  const std::vector<float> yv = y.to_vector<float>();
  bool same = y.sharding() == x.sharding() && sv.size() == yv.size();
  for (size_t i = 0; same && i < yv.size(); ++i) {
    same = ulps_apart(sv[i], static_cast<float>(std::sin(double(i)))) <= 2 &&
           yv[i] == 2.0f * sv[i] + 1.0f;
  }
  std::printf(
      "   same sharding as x and y == 2 * sin(x) + 1 on every element (sin within 2 ulp): %s\n\n",
      same ? "yes" : "MISMATCH");
  Array s0 = sum(x, 0);
  (void)s0.to_vector<float>();  // reading the pending sum runs its psum
  step("sum(x, 0) (a pending sum, summed when read)", s0, log);
  step("sum(x, 1)", sum(x, 1), log);
  step("with_sharding_constraint(sum(x, 0), P('x')) (8 does not divide over 3 devices)",
       with_sharding_constraint(sum(x, 0), NamedSharding(mesh, P("x"))), log);
  Array x12 = iota({3, 12});
  step("the same on a (3, 12) input: one psum_scatter",
       with_sharding_constraint(sum(x12, 0), NamedSharding(mesh, P("x"))), log);
}

// Part 6: training with value_and_grad: the forward pass written once, the parameters a
// MESHRT_TREE struct, the gradient a tree sharded like the parameters.
void part6() {
  std::printf("== Part 6: training with value_and_grad (MLP [784, 128 x 5, 8], batch 64)\n\n");
  const std::vector<int64_t> sizes{784, 128, 128, 128, 128, 128, 8};
  mlp::Problem problem = mlp::init(random::key(0), sizes, 64);
  Mesh mesh = make_mesh({8}, {"batch"}, g_platform);
  for (mlp::Strategy s : {mlp::Strategy::data_parallel, mlp::Strategy::fsdp}) {
    const mlp::Placement at = mlp::placement(s, mesh);
    mlp::Params params = mlp::device_put_params(problem, s, mesh);
    const Array x = device_put(problem.x, {64, 784}, NamedSharding(mesh, at.x));
    const Array y = device_put(problem.y, {64, 8}, NamedSharding(mesh, at.x));
    std::printf("-- %s: W %s, x %s\n   loss:", mlp::name(s), at.w.str().c_str(),
                at.x.str().c_str());
    double first = 0, last = 0;
    CollectiveLog log;
    for (int step = 0; step < 10; ++step) {
      std::optional<CollectiveLog::Recording> on;
      if (step == 0) on.emplace(log.record());  // the collectives of one step
      auto [loss, grads] = value_and_grad(mlp::loss)(params, x, y);
      params =
          tree_map([](const Array& w, const Array& g) { return w - 0.001 * g; }, params, grads);
      on.reset();
      last = loss.to_vector<float>()[0];
      if (step == 0) first = last;
      std::printf(" %.4f", last);
    }
    int psum = 0, scatter = 0, gather = 0;
    for (const auto& e : log.entries()) {
      psum += e.collective == "psum";
      scatter += e.collective == "psum_scatter";
      gather += e.collective == "all_gather";
    }
    std::printf(
        "\n   one step inserted %d psum, %d psum_scatter, %d all_gather for %zu "
        "parameters (CollectiveLog); gradients sharded like the parameters: %s\n\n",
        psum, scatter, gather, params.W.size() + params.b.size(),
        params.W[0].sharding() == NamedSharding(mesh, at.w) ? "yes" : "NO");
    if (!(last < first)) {
      std::printf("   the loss did not fall: MISMATCH\n");
      std::exit(1);
    }
  }
}

// Part 7: mixed precision: float32 master parameters, the layers in bfloat16 (astype inside the
// loss), the loss in float32, float32 gradients; the same data and init as a float32 run.
void part7() {
  std::printf(
      "== Part 7: mixed precision (MLP [784, 128 x 5, 8], batch 64): float32 master parameters, "
      "bfloat16 layers, float32 loss\n\n");
  const std::vector<int64_t> sizes{784, 128, 128, 128, 128, 128, 8};
  const mlp::Problem problem = mlp::init(random::key(0), sizes, 64);
  Mesh mesh = make_mesh({8}, {"batch"}, g_platform);
  constexpr int kSteps = 10;
  constexpr double kTolerance = 1e-2;  // relative, per step (bfloat16 keeps 8 significant bits)
  for (mlp::Strategy s : {mlp::Strategy::data_parallel, mlp::Strategy::fsdp}) {
    const std::vector<double> f32 =
        mlp::train_losses(problem, s, mesh, mlp::Precision::f32, kSteps, 0.001f);
    const std::vector<double> bf16 =
        mlp::train_losses(problem, s, mesh, mlp::Precision::bf16, kSteps, 0.001f);
    std::printf("-- %s\n   float32:", mlp::name(s));
    for (double l : f32) std::printf(" %.4f", l);
    std::printf("\n   bf16:   ");
    for (double l : bf16) std::printf(" %.4f", l);
    double worst = 0;
    for (size_t i = 0; i < f32.size(); ++i)
      worst = std::max(worst, std::fabs(bf16[i] - f32[i]) / f32[i]);
    std::printf("\n   largest |bf16 - float32| / float32 over %d steps: %.1e (tolerance %.0e)\n\n",
                kSteps, worst, kTolerance);
    if (!(worst <= kTolerance) || !(bf16.back() < bf16.front())) {
      std::printf("   the bf16 loss does not track the float32 run: MISMATCH\n");
      std::exit(1);
    }
  }
}

void run_demo(bool quick);

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else if (std::strncmp(argv[i], "--platform=", 11) == 0)
      g_platform = argv[i] + 11;
    else {
      std::fprintf(stderr, "usage: meshrt-demo [--quick] [--platform=cpu|cuda]\n");
      return 2;
    }
  }
  // Parts 1-3 need 8 devices: on cuda, 8 logical devices per GPU unless told otherwise.
  if (g_platform == "cuda") setenv("MESHRT_CUDA_DEVICES_PER_GPU", "8", 0);
  try {
    run_demo(quick);
  } catch (const Error& e) {
    std::fprintf(stderr, "meshrt-demo: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

void run_demo(bool quick) {
  std::printf("== meshrt demo\nplatforms:");
  for (const std::string& p : platforms()) std::printf(" %s", p.c_str());
  std::printf("\ncpu devices:");
  for (const Device& d : devices("cpu")) std::printf(" %s", d.str().c_str());
  std::printf("\nrunning parts 1-3 on: %s", g_platform.c_str());
  std::printf(
      "\n\n== Part 1: meshes and shardings (jax.debug.visualize_array_sharding layout)\n\n");

  Mesh m8 = make_mesh({8}, {"data"}, g_platform);
  show(m8, P(), {8});
  show(m8, P("data"), {8});
  show(m8, P("data", None), {8, 4});
  show(m8, P(None, "data"), {2, 16});
  for (Shape ms : {Shape{4, 2}, Shape{2, 4}}) {
    Mesh mesh = make_mesh(ms, {"data", "model"}, g_platform);
    for (const PartitionSpec& spec :
         {P(), P("data", None), P(None, "model"), P("data", "model"),
          P(Axes{"data", "model"}, None), P(Axes{"model", "data"}), P("model", "data")}) {
      show(mesh, spec, {8, 4});
    }
  }

  std::printf("== Resharding moves only the blocks that must move\n\n");
  Mesh mesh = make_mesh({4, 2}, {"data", "model"}, g_platform);
  std::vector<float> host(64);
  std::iota(host.begin(), host.end(), 0.0f);
  Array a = device_put(host, {8, 8}, NamedSharding(mesh, P("data", None)));
  for (const PartitionSpec& to : {P("data", "model"), P("data", None), P("model", "data"), P()}) {
    Array b = device_put(a, NamedSharding(mesh, to));
    int shared = 0;  // blocks at the same address: kept, not copied
    const std::vector<Shard> as = a.addressable_shards(), bs = b.addressable_shards();
    for (size_t i = 0; i < bs.size(); ++i) shared += bs[i].data.data() == as[i].data.data();
    bool same = b.to_vector<float>() == host;
    std::printf("   %s -> %-14s blocks kept in place: %d/8, value preserved: %s\n",
                P("data", None).str().c_str(), to.str().c_str(), shared, same ? "yes" : "NO");
  }

  part2();
  part3(quick);
  part4();
  part5();
  part6();
  part7();
  jit_demo();
}
