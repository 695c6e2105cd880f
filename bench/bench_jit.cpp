// jit against eager on the same program, in the same run:
//   Program20/eager   a 20-op elementwise/reduction program (one psum) on 8 cpu devices, (8, 8)
//                     float32 sharded P("x"): every op a separate launch from the caller
//   Program20/jit     the same program jitted: the recorded steps replayed, one launch per call
//   Program20/local/{eager,jit}  the same with op 19 over the unsharded dim (no collective)
//   TinyOp/eager      add(x, x) on the same Array (one op's overhead, for the ratio)
//   Sin/eager, Sin/jit  2 * sin(x) + 1 on (8, 8)
//   MlpStep/{eager,jit}  value_and_grad of a small DP MLP's loss (the gradients' psums inside)
//   ShardMapPsum/{eager,jit}  a shard_map call whose body is one psum of one float, and the same
//                     call inside jit (its body recorded once, replayed as ops: docs/jit.md)
//   ShardMapGrad/{eager,jit}  value_and_grad of a per-device (shard_map) two-layer loss over 8
//                     devices, (64, 32) inputs: the forward and transpose bodies replayed
//   AdamUpdate/{eager,jit,jit_unfused}/rows, Memcpy/rows  adam's update of a (rows, 1024) leaf
//                     over 8 devices, fused into elementwise chains or not, against a memcpy of
//                     the bytes it must move
// JAX's jitted call of the same programs: bench/jax_jit_overhead.py.
// Run: MESHRT_CPU_DEVICES=8 build/bench/bench_jit --benchmark_repetitions=7
//      --benchmark_report_aggregates_only=true   (compare the medians)
#include <benchmark/benchmark.h>
#include <meshrt/meshrt.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

using namespace meshrt;

namespace {

Mesh mesh8() { return make_mesh({8}, {"x"}); }

Array input(double v) { return full({8, 8}, v, DType::f32, NamedSharding(mesh8(), P("x"))); }

// The same 20 ops as bench/jax_jit_overhead.py's program20.
Array program20_over(const Array& x, const Array& y, int over) {
  Array a = sin(x);           // 1
  Array b = a * 2.0;          // 2
  Array c = b + 1.0;          // 3
  Array d = c * y;            // 4
  Array e = exp(d);           // 5
  Array f = e - y;            // 6
  Array g = tanh(f);          // 7
  Array h = g / 3.0;          // 8
  Array i = h + a;            // 9
  Array j = maximum(i, c);    // 10
  Array k = sum(j, 1, true);  // 11
  Array l = j - k;            // 12
  Array m = l * l;            // 13
  Array n = sqrt(m + 1.0);    // 14, 15
  Array o = log(n);           // 16
  Array p = max(o, 1, true);  // 17
  Array q = o - p;            // 18
  Array r = sum(q, over);     // 19: over the sharded dim 0 (a psum), or dim 1
  return tanh(r);             // 20
}

Array program20(const Array& x, const Array& y) { return program20_over(x, y, 0); }
// The same with op 19 over the unsharded dim: no collective (JAX's script measures this one).
Array program20_local(const Array& x, const Array& y) { return program20_over(x, y, 1); }

void Program20LocalEager(benchmark::State& st) {
  Array x = input(0.5), y = input(0.25);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(program20_local(x, y)));
}
void Program20LocalJit(benchmark::State& st) {
  Array x = input(0.5), y = input(0.25);
  auto f = jit(program20_local);
  (void)f(x, y);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(f(x, y)));
}
void Program20Eager(benchmark::State& st) {
  Array x = input(0.5), y = input(0.25);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(program20(x, y)));
}
void Program20Jit(benchmark::State& st) {
  Array x = input(0.5), y = input(0.25);
  auto f = jit(program20);
  (void)f(x, y);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(f(x, y)));
}
void TinyOpEager(benchmark::State& st) {
  Array x = input(0.5);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(add(x, x)));
}
Array sin3(const Array& x) { return 2.0 * sin(x) + 1.0; }
void SinEager(benchmark::State& st) {
  Array x = input(0.5);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(sin3(x)));
}
void SinJit(benchmark::State& st) {
  Array x = input(0.5);
  auto f = jit(sin3);
  (void)f(x);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(f(x)));
}

// A data-parallel MLP training step (loss and gradients): batch (512, 256) sharded P("x"),
// parameters (256, 256), (256,), (256, 16) replicated; the gradients' psums are its collectives.
struct MlpParams {
  Array w1, b1, w2;
};
MESHRT_TREE(MlpParams, w1, b1, w2);

Array mlp_loss(const MlpParams& p, const Array& x, const Array& y) {
  Array h = relu(matmul(x, p.w1) + p.b1);
  Array d = matmul(h, p.w2) - y;
  return mean(d * d);
}

struct MlpSetup {
  MlpParams p;
  Array x, y;
};
MlpSetup mlp_setup() {
  Mesh m = mesh8();
  NamedSharding rep(m, P()), dp(m, P("x"));
  return {{random::normal(random::key(1), {256, 256}, rep), zeros({256}, DType::f32, rep),
           random::normal(random::key(2), {256, 16}, rep)},
          random::normal(random::key(3), {512, 256}, dp),
          random::normal(random::key(4), {512, 16}, dp)};
}
void MlpStepEager(benchmark::State& st) {
  MlpSetup s = mlp_setup();
  auto vg = value_and_grad(mlp_loss);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(vg(s.p, s.x, s.y)));
}
void MlpStepJit(benchmark::State& st) {
  MlpSetup s = mlp_setup();
  auto step = jit(value_and_grad(mlp_loss));
  (void)step(s.p, s.x, s.y);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(step(s.p, s.x, s.y)));
}

// optax's adam update of one (rows, 1024) float32 leaf sharded P("x") over 8 devices: the
// moments and the parameter from the gradient. It moves at least 7 arrays (p, m, v, g read; p, m,
// v written): the bytes each row reports. jit fuses it into three elementwise chains (one per
// result); jit_unfused (MESHRT_JIT_FUSION=0) runs its 14 kernels through memory. Memcpy/<rows>
// copies the same bytes (half read, half written) with one thread per core: the memory's
// bandwidth in the same run, the ratio's baseline. 1024 rows (28 MiB moved) fit a 32 MiB L3;
// 8192 (224 MiB) do not.
struct Adam {
  Array p, m, v;
};
MESHRT_TREE(Adam, p, m, v);

Adam adam_update(const Adam& s, const Array& g) {
  Array m = 0.9 * s.m + 0.1 * g;
  Array v = 0.999 * s.v + 0.001 * (g * g);
  Array mhat = m / (1.0 - 0.9), vhat = v / (1.0 - 0.999);
  return {s.p - 1e-3 * (mhat / (sqrt(vhat) + 1e-8)), m, v};
}

void ShardMapPsum(benchmark::State& st, bool jitted) {
  const Mesh mesh = mesh8();
  Array x = device_put(std::vector<float>(8, 1.f), {8}, NamedSharding(mesh, P("x")));
  auto f = [mesh](const Array& a) {
    return shard_map([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, mesh, {P("x")},
                     P())(a);
  };
  auto j = jit(f);
  for (auto _ : st) benchmark::DoNotOptimize(jitted ? j(x) : f(x));
}

void ShardMapGrad(benchmark::State& st, bool jitted) {
  const Mesh mesh = mesh8();
  auto loss = [mesh](const Array& w1, const Array& w2, const Array& x) {
    auto body = [](Context& c, const Tensor& a, const Tensor& b, const Tensor& xb) {
      Tensor h = relu(matmul(xb, a));
      Tensor y = tanh(matmul(h, b));
      return c.pmean(sum(y * y), "x");
    };
    return shard_map(body, mesh, {P(), P(), P("x")}, P())(w1, w2, x);
  };
  auto f = value_and_grad<0, 1>(loss);
  auto j = jit(f);
  NamedSharding rep(mesh, P()), rows(mesh, P("x"));
  Array w1 = full({32, 32}, 0.03, DType::f32, rep);
  Array w2 = full({32, 8}, 0.02, DType::f32, rep);
  Array x = full({64, 32}, 0.5, DType::f32, rows);
  for (auto _ : st) benchmark::DoNotOptimize(jitted ? j(w1, w2, x) : f(w1, w2, x));
}

Array big(int64_t rows, double v) {
  return full({rows, 1024}, v, DType::f32, NamedSharding(mesh8(), P("x")));
}

void AdamUpdate(benchmark::State& st, int mode) {  // 0 eager, 1 jit, 2 jit unfused
  const int64_t rows = st.range(0);
  Adam s{big(rows, 1.0), big(rows, 0.5), big(rows, 0.25)};
  Array g = big(rows, 0.125);
  if (mode == 2) setenv("MESHRT_JIT_FUSION", "0", 1);
  auto f = jit(adam_update);
  if (mode != 0) (void)block_until_ready(f(s, g).p);
  unsetenv("MESHRT_JIT_FUSION");
  for (auto _ : st) {
    Adam out = mode == 0 ? adam_update(s, g) : f(s, g);
    (void)block_until_ready(out.p);
    benchmark::DoNotOptimize(out);
  }
  st.SetBytesProcessed(st.iterations() * 7 * rows * 1024 * 4);
}

void Memcpy(benchmark::State& st) {
  const size_t half = static_cast<size_t>(st.range(0)) * 1024 * 4 * 7 / 2;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<char> src(half, 1), dst(half, 0);
  for (auto _ : st) {
    std::vector<std::thread> pool;
    const size_t part = half / threads;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t n = t + 1 == threads ? half - t * part : part;
        std::memcpy(dst.data() + t * part, src.data() + t * part, n);
      });
    }
    for (std::thread& th : pool) th.join();
    benchmark::DoNotOptimize(dst.data());
  }
  st.SetBytesProcessed(st.iterations() * 2 * static_cast<int64_t>(half));
}

}  // namespace

BENCHMARK_CAPTURE(ShardMapPsum, eager, false)->Name("ShardMapPsum/eager")->UseRealTime();
BENCHMARK_CAPTURE(ShardMapPsum, jit, true)->Name("ShardMapPsum/jit")->UseRealTime();
BENCHMARK_CAPTURE(ShardMapGrad, eager, false)->Name("ShardMapGrad/eager")->UseRealTime();
BENCHMARK_CAPTURE(ShardMapGrad, jit, true)->Name("ShardMapGrad/jit")->UseRealTime();
BENCHMARK_CAPTURE(AdamUpdate, eager, 0)
    ->Name("AdamUpdate/eager")
    ->Arg(1024)
    ->Arg(8192)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(AdamUpdate, jit, 1)
    ->Name("AdamUpdate/jit")
    ->Arg(1024)
    ->Arg(8192)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(AdamUpdate, jit_unfused, 2)
    ->Name("AdamUpdate/jit_unfused")
    ->Arg(1024)
    ->Arg(8192)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(Memcpy)->Arg(1024)->Arg(8192)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(MlpStepEager)->Name("MlpStep/eager")->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(MlpStepJit)->Name("MlpStep/jit")->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(Program20Eager)->Name("Program20/eager")->UseRealTime();
BENCHMARK(Program20Jit)->Name("Program20/jit")->UseRealTime();
BENCHMARK(Program20LocalEager)->Name("Program20/local/eager")->UseRealTime();
BENCHMARK(Program20LocalJit)->Name("Program20/local/jit")->UseRealTime();
BENCHMARK(TinyOpEager)->Name("TinyOp/eager")->UseRealTime();
BENCHMARK(SinEager)->Name("Sin/eager")->UseRealTime();
BENCHMARK(SinJit)->Name("Sin/jit")->UseRealTime();

int main(int argc, char** argv) {
  if (std::getenv("MESHRT_CPU_DEVICES") == nullptr) set_cpu_device_count(8);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
