// meshrt-kernel-report: one device's op kernels against the memory copy bound, and the seed MLP
// step's matrix products, timed to completion (block_until_ready) on the default platform.
//
//   MESHRT_PLATFORM=cuda MESHRT_CUDA_DEVICES_PER_GPU=2 build/bench/meshrt-kernel-report [--quick]
//
// Every row queues its op `kIters` times back to back and waits once (the rate a step sees, not
// one launch's latency), median of the repeats. Bandwidth counts the minimal bytes read plus
// written by one op; the baseline is a 1 GiB copy between devices 0 and 1 of the platform (on a
// GPU split into logical devices, a device-to-device copy inside its memory), counted the same
// way. The matmul rows are the 16 products of one seed MLP step ([784, 1024 x 5, 8], batch 8192,
// float32): forward x @ W, backward x^T @ g and g @ W^T, operands stored as the step stores them.
// The layer rows time one hidden layer's relu(x @ W + b) eager op by op (a named product, then
// the bias add and relu), eager as one expression (one product with its epilogue where the
// platform fuses them: MESHRT_CUDA_MATMUL=lt; see the global view's docs) and jitted (the same
// fusion by jit's matcher), at each matmul precision, and one hidden layer's backward through relu,
// where(y > 0, g @ W^T, 0), eager and jitted (relu's gradient in the product's epilogue where the
// platform fuses it); --layers-only prints only those. The adam
// rows time one leaf's optimizer update eager and jitted (elementwise chains where the platform
// fuses them); --fused-only prints only the pairs and the adam rows.
#include <meshrt/meshrt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace meshrt;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `op` (which returns the result to wait for), `iters` calls queued back to
// back, then one wait; median of `repeats`.
double time_op(const std::function<Tensor()>& op, int iters, int repeats) {
  op().block_until_ready();  // warm-up: allocator, library handles, kernel loading
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    Tensor last;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) last = op();
    last.block_until_ready();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                iters);
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, layers_only = false, fused_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--layers-only") == 0) {
      layers_only = true;
    } else if (std::strcmp(argv[i], "--fused-only") == 0) {
      fused_only = true;
    } else {
      std::fprintf(
          stderr,
          "usage: meshrt-kernel-report [--quick] [--layers-only | --fused-only]   (platform: "
          "MESHRT_PLATFORM; needs 2 devices for the copy baseline)\n");
      return 2;
    }
  }
  try {
    const std::vector<Device>& devs = devices();
    if (devs.size() < 2) {
      std::fprintf(stderr,
                   "meshrt-kernel-report: the copy baseline needs 2 devices of the platform "
                   "(MESHRT_CUDA_DEVICES_PER_GPU=2, or MESHRT_CPU_DEVICES=2)\n");
      return 2;
    }
    const Device d = devs[0];
    const int iters = quick ? 2 : 20, repeats = quick ? 2 : 7;
    const int64_t rows = quick ? 512 : 8192, cols = quick ? 256 : 1024;

    // The copy baseline: 1 GiB (quick: 64 MiB) from device 0 to device 1, bytes read + written.
    const int64_t copy_elems = (quick ? 64 : 1024) * (int64_t{1} << 20) / 4;
    Tensor big = ones({copy_elems}, DType::f32, d);
    const Sharding on1 = SingleDeviceSharding(devs[1]);
    double copy_t = 0;
    {
      device_put(big, on1).block_until_ready();
      std::vector<double> t;
      for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        device_put(big, on1).block_until_ready();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      copy_t = median(t);
    }
    big = Tensor();
    const double copy_bw = 2.0 * static_cast<double>(copy_elems) * 4 / copy_t;
    std::printf("meshrt-kernel-report: %s, device %s; %d ops queued per wait, median of %d\n",
                std::string(d.platform()).c_str(), d.str().c_str(), iters, repeats);
    std::printf(
        "copy baseline: %.0f MiB %s -> %s in %.1f us = %.1f GB/s (bytes read + written)\n\n",
        static_cast<double>(copy_elems) * 4 / (1 << 20), d.str().c_str(), devs[1].str().c_str(),
        copy_t * 1e6, copy_bw / 1e9);

    // The jitted rows' Arrays live on device d alone; block() is the Tensor a row waits for.
    const Mesh one = make_mesh({1}, {"d"}, std::vector<Device>{d});
    const NamedSharding rep(one, P());
    auto block = [](const Array& a) { return a.addressable_shards().front().data; };

    // One hidden layer of the seed step, relu(x @ W + b): eager op by op (the product, then the
    // bias add and relu), eager as one expression and jitted (both one product call where the
    // platform fuses epilogues).
    if (!fused_only) {
      std::printf(
          "| one layer | eager, op by op | eager, one expression | jit | jit / op by op | "
          "epilogue fused |\n");
      std::printf("| --- | --- | --- | --- | --- | --- |\n");
    }
    for (Precision prec : {Precision::highest, Precision::tf32}) {
      if (fused_only) break;
      const Array xa = device_put(random::normal(random::key(30), {rows, cols}, d), rep);
      const Array wa = device_put(random::normal(random::key(31), {cols, cols}, d), rep);
      const Array ba = device_put(random::normal(random::key(32), {cols}, d), rep);
      auto layer = [prec](const Array& x, const Array& w, const Array& b) {
        return relu(matmul(x, w, OpOptions{.precision = prec}) + b);
      };
      auto op_by_op = [prec](const Array& x, const Array& w, const Array& b) {
        const Array product = matmul(x, w, OpOptions{.precision = prec});  // named: on its own
        return relu(product + b);
      };
      auto jit_layer = jit(layer);
      const std::string text = jit_layer.lower(xa, wa, ba).as_text();
      const bool fused = text.find("carry their layer's bias add") != std::string::npos;
      const double f = 2.0 * static_cast<double>(rows * cols * cols);
      const double to = time_op([&] { return block(op_by_op(xa, wa, ba)); }, iters, repeats);
      const double te = time_op([&] { return block(layer(xa, wa, ba)); }, iters, repeats);
      const double tj = time_op([&] { return block(jit_layer(xa, wa, ba)); }, iters, repeats);
      std::printf(
          "| relu(x @ W + b), (%lld x %lld) @ (%lld x %lld), %s | %.1f us (%.2f TFLOP/s) | "
          "%.1f us (%.2f TFLOP/s) | %.1f us (%.2f TFLOP/s) | %.3f | %s |\n",
          static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(cols),
          static_cast<long long>(cols), std::string(precision_name(prec)).c_str(), to * 1e6,
          f / to / 1e12, te * 1e6, f / te / 1e12, tj * 1e6, f / tj / 1e12, tj / to,
          fused ? "yes" : "no");
    }
    std::printf("\n");
    // One hidden layer's backward through relu, where(y > 0, g @ W^T, 0): eager (the product, then
    // the comparison and the select) and jitted (one product with relu's gradient in its epilogue
    // where the platform fuses it: MESHRT_CUDA_MATMUL=lt).
    if (!fused_only) {
      std::printf("| one layer's backward | eager | jit | jit / eager | relu's gradient fused |\n");
      std::printf("| --- | --- | --- | --- | --- |\n");
    }
    for (Precision prec : {Precision::highest, Precision::tf32}) {
      if (fused_only) break;
      const Array ga = device_put(random::normal(random::key(33), {rows, cols}, d), rep);
      const Array wa = device_put(random::normal(random::key(34), {cols, cols}, d), rep);
      const Array ya = device_put(relu(random::normal(random::key(35), {rows, cols}, d)), rep);
      const Array zero = full({}, 0.0, DType::f32, rep);
      auto backward = [prec, zero](const Array& g, const Array& w, const Array& y) {
        return where(y > 0.0, matmul_transposed(g, w, false, true, OpOptions{.precision = prec}),
                     zero);
      };
      auto jit_backward = jit(backward);
      const std::string text = jit_backward.lower(ga, wa, ya).as_text();
      const bool fused = text.find("carry relu's gradient") != std::string::npos;
      const double f = 2.0 * static_cast<double>(rows * cols * cols);
      const double te = time_op([&] { return block(backward(ga, wa, ya)); }, iters, repeats);
      const double tj = time_op([&] { return block(jit_backward(ga, wa, ya)); }, iters, repeats);
      std::printf(
          "| where(y > 0, g @ W^T, 0), (%lld x %lld) @ (%lld x %lld)^T, %s | %.1f us (%.2f "
          "TFLOP/s) | %.1f us (%.2f TFLOP/s) | %.3f | %s |\n",
          static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(cols),
          static_cast<long long>(cols), std::string(precision_name(prec)).c_str(), te * 1e6,
          f / te / 1e12, tj * 1e6, f / tj / 1e12, tj / te, fused ? "yes" : "no");
    }
    std::printf("\n");
    if (layers_only) return 0;

    const Tensor x = random::normal(random::key(1), {rows, cols}, d);
    const Tensor y = random::normal(random::key(2), {rows, cols}, d);
    const Tensor bias = random::normal(random::key(3), {cols}, d);
    const Tensor cond = x > 0.0;
    const double e = static_cast<double>(rows * cols);
    struct Row {
      const char* name;
      std::function<Tensor()> op;
      double bytes;  // read + written by one op
    };
    const std::vector<Row> table = {
        {"a + b", [&] { return x + y; }, 3 * 4 * e},
        {"a * 2 (scalar)", [&] { return x * 2.0; }, 2 * 4 * e},
        {"a + bias row", [&] { return x + bias; }, 2 * 4 * e + 4.0 * cols},
        {"relu(a)", [&] { return relu(x); }, 2 * 4 * e},
        {"exp(a)", [&] { return exp(x); }, 2 * 4 * e},
        {"a > 0 (bool out)", [&] { return x > 0.0; }, 5 * e},
        {"where(c, a, b)", [&] { return where(cond, x, y); }, (1 + 3 * 4) * e},
        {"sum over rows (axis 0)", [&] { return sum(x, 0); }, 4 * e + 4.0 * cols},
        {"sum over columns (axis 1)", [&] { return sum(x, 1); }, 4 * e + 4.0 * rows},
        {"max over axis 1", [&] { return max(x, 1); }, 4 * e + 4.0 * rows},
        {"argmax over axis 1", [&] { return argmax(x, 1); }, 4 * e + 8.0 * rows},
        {"softmax over axis 1", [&] { return softmax(x, 1); }, 2 * 4 * e},
    };
    std::printf("| op on (%lld, %lld) float32 | time (us) | GB/s (read + written) | x copy bw |\n",
                static_cast<long long>(rows), static_cast<long long>(cols));
    std::printf("| --- | --- | --- | --- |\n");
    for (const Row& r : table) {
      if (fused_only) break;
      const double t = time_op(r.op, iters, repeats);
      std::printf("| %s | %.1f | %.1f | %.2f |\n", r.name, t * 1e6, r.bytes / t / 1e9,
                  r.bytes / t / copy_bw);
    }

    // The seed step's elementwise pairs, eager (two kernels, the intermediate in memory) and
    // jitted (one fused kernel where the platform fuses: cuda), on one device; bytes are the
    // fused kernel's (what the pair must move at least).
    {
      const Array xa = device_put(x, rep), ya = device_put(y, rep), ba = device_put(bias, rep);
      auto bias_relu = [](const Array& a, const Array& b) { return relu(a + b); };
      const Array zero = full({}, 0.0, DType::f32, rep);  // relu's gradient's scalar, as autodiff
      auto relu_grad = [zero](const Array& a, const Array& g) { return where(a > 0.0, g, zero); };
      auto jit_bias_relu = jit(bias_relu);
      auto jit_relu_grad = jit(relu_grad);
      struct Pair {
        const char* name;
        std::function<Tensor()> op;
        double bytes;
      };
      const std::vector<Pair> pairs = {
          {"relu(a + bias row), eager", [&] { return block(bias_relu(xa, ba)); },
           2 * 4 * e + 4.0 * cols},
          {"relu(a + bias row), jit", [&] { return block(jit_bias_relu(xa, ba)); },
           2 * 4 * e + 4.0 * cols},
          {"where(a > 0, g, 0), eager", [&] { return block(relu_grad(xa, ya)); }, 3 * 4 * e},
          {"where(a > 0, g, 0), jit", [&] { return block(jit_relu_grad(xa, ya)); }, 3 * 4 * e},
      };
      for (const Pair& r : pairs) {
        const double t = time_op(r.op, iters, repeats);
        std::printf("| %s | %.1f | %.1f | %.2f |\n", r.name, t * 1e6, r.bytes / t / 1e9,
                    r.bytes / t / copy_bw);
      }
      // adam's update of one leaf (14 elementwise kernels), eager and jitted (three elementwise
      // chains, one per result, where the platform fuses chains: cpu, cuda under
      // MESHRT_CUDA_FUSION=chains); bytes are the 7 arrays it must move (p, m, v, g read; p, m, v
      // written).
      auto adam = [](const Array& p, const Array& m, const Array& v, const Array& g) {
        const Array m2 = 0.9 * m + 0.1 * g;
        const Array v2 = 0.999 * v + 0.001 * (g * g);
        const Array p2 = p - 1e-3 * ((m2 / (1.0 - 0.9)) / (sqrt(v2 / (1.0 - 0.999)) + 1e-8));
        return std::vector<Array>{p2, m2, v2};
      };
      auto jit_adam = jit(adam);
      const Array va = device_put(y * y, rep);  // v >= 0, as a second moment
      const bool chains =
          jit_adam.lower(xa, ya, va, xa).as_text().find("elementwise chains") != std::string::npos;
      const double t_eager =
          time_op([&] { return block(adam(xa, ya, va, xa)[0]); }, iters, repeats);
      const double t_jit =
          time_op([&] { return block(jit_adam(xa, ya, va, xa)[0]); }, iters, repeats);
      for (const auto& [name, t] :
           {std::pair{"adam update (14 kernels), eager", t_eager},
            std::pair{chains ? "adam update, jit (3 fused chains)" : "adam update, jit (unfused)",
                      t_jit}}) {
        std::printf("| %s | %.1f | %.1f | %.2f |\n", name, t * 1e6, 7 * 4 * e / t / 1e9,
                    7 * 4 * e / t / copy_bw);
      }
    }

    if (fused_only) return 0;

    // The seed step's products, at each matmul precision (tf32: tensor cores where the platform
    // has them; cpu computes full precision either way).
    const std::vector<int64_t> sizes{784, cols, cols, cols, cols, cols, 8};
    for (Precision prec : {Precision::highest, Precision::tf32}) {
      const MatmulOptions mo{prec};
      double step_mm = 0, step_flops = 0;
      std::printf("\n| seed step product (batch %lld), precision %s | time (us) | TFLOP/s |\n",
                  static_cast<long long>(rows), std::string(precision_name(prec)).c_str());
      std::printf("| --- | --- | --- |\n");
      for (size_t l = 0; l + 1 < sizes.size(); ++l) {
        const Tensor in = random::normal(random::key(10), {rows, sizes[l]}, d);
        const Tensor w = random::normal(random::key(11), {sizes[l], sizes[l + 1]}, d);
        const Tensor g = random::normal(random::key(12), {rows, sizes[l + 1]}, d);
        const double f = 2.0 * static_cast<double>(rows * sizes[l] * sizes[l + 1]);
        struct Mm {
          std::string name;
          std::function<Tensor()> op;
        };
        std::vector<Mm> mms = {
            {"x @ W", [&] { return matmul(in, w, mo); }},
            {"x^T @ g", [&] { return matmul_transposed(in, g, true, false, mo); }},
        };
        if (l > 0) {
          mms.push_back({"g @ W^T", [&] { return matmul_transposed(g, w, false, true, mo); }});
        }
        for (const Mm& mm : mms) {
          const double t = time_op(mm.op, iters, repeats);
          step_mm += t;
          step_flops += f;
          std::printf("| layer %zu %s (%lld x %lld) | %.1f | %.2f |\n", l, mm.name.c_str(),
                      static_cast<long long>(sizes[l]), static_cast<long long>(sizes[l + 1]),
                      t * 1e6, f / t / 1e12);
        }
      }
      std::printf(
          "\nstep products at %s: %.1f GFLOP in %.3f ms = %.2f TFLOP/s (the step's matmul "
          "time)\n",
          std::string(precision_name(prec)).c_str(), step_flops / 1e9, step_mm * 1e3,
          step_flops / step_mm / 1e12);
    }

    // The collective matmul over every device of the platform: naive (the collective, then the
    // product) against overlapped and bidirectional (a ring of shifts, each overlapping a block
    // product).
    {
      const int64_t nd = static_cast<int64_t>(devs.size());
      const int64_t m = quick ? 64 * nd : 1024 * nd, kk = m, nn = quick ? 256 : 4096;
      Mesh mesh = make_mesh({nd}, {"x"});
      const Array lhs_rows = device_put(random::normal(random::key(20), {m, kk}, d),
                                        NamedSharding(mesh, P("x", None)));
      const Array lhs_cols = device_put(random::normal(random::key(21), {m, kk}, d),
                                        NamedSharding(mesh, P(None, "x")));
      const Array rhs = device_put(random::normal(random::key(22), {kk, nn}, d),
                                   NamedSharding(mesh, P("x", None)));
      const double f = 2.0 * static_cast<double>(m * kk * nn);
      std::printf(
          "\n| collective matmul, %lld devices, (%lld x %lld) @ (%lld x %lld) | naive (ms) "
          "| overlapped (ms) | bidirectional (ms) | best vs naive |\n",
          static_cast<long long>(nd), static_cast<long long>(m), static_cast<long long>(kk),
          static_cast<long long>(kk), static_cast<long long>(nn));
      std::printf("| --- | --- | --- | --- | --- |\n");
      for (int which = 0; which < 2; ++which) {
        double t[3];
        for (int v = 0; v < 3; ++v) {
          const auto variant = static_cast<collective_matmul::Variant>(v);
          auto run = [&] {
            return which == 0
                       ? collective_matmul::allgather_matmul(lhs_rows, rhs, mesh, "x", variant)
                       : collective_matmul::matmul_reduce_scatter(lhs_cols, rhs, mesh, "x",
                                                                  variant);
          };
          run().block_until_ready();
          std::vector<double> ts;
          for (int r = 0; r < repeats; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            run().block_until_ready();
            ts.push_back(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
          t[v] = median(ts);
        }
        std::printf("| %s (%.1f TFLOP/s at best) | %.3f | %.3f | %.3f | %.2fx |\n",
                    which == 0 ? "allgather_matmul" : "matmul_reduce_scatter",
                    f / std::min({t[0], t[1], t[2]}) / 1e12, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3,
                    t[0] / std::min(t[1], t[2]));
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "meshrt-kernel-report: %s\n", e.what());
    return 1;
  }
  return 0;
}
