// Google Benchmark suites for the collectives (each algorithm) and the rendezvous cost.
// Run: ./run.sh bench. An iteration is one shard_map launch running the collective `calls` times
// back to back on 8 simulated cpu devices; the us_per_call counter is the time per call.
#include <benchmark/benchmark.h>
#include <meshrt/meshrt.h>

#include <chrono>
#include <vector>

namespace {

using namespace meshrt;

// Times `calls` back-to-back calls of op inside one body (device 0's clock): total seconds.
template <class Op>
double per_call_seconds(int64_t elems, int64_t calls, Op op) {
  Mesh mesh = make_mesh({8}, {"x"});
  Array x = device_put(std::vector<float>(static_cast<size_t>(8 * elems), 1.f), {8 * elems},
                       NamedSharding(mesh, P("x")));
  double seconds = 0;
  shard_map(
      [&](Context& c, const Tensor& t) {
        op(c, t);  // warm-up
        c.psum(ones({1}, DType::f32, c.device()), "x");
        auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < calls; ++i) op(c, t);
        if (c.axis_index("x") == 0) {
          seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        return t;
      },
      mesh, {P("x")}, P("x"))(x);
  return seconds;
}

CollectiveOptions algo(int64_t a) {
  return {a == 0   ? CollectiveAlgo::direct
          : a == 1 ? CollectiveAlgo::ring
                   : CollectiveAlgo::bidi_ring};
}

void set_label(benchmark::State& state) {
  static const char* names[] = {"direct", "ring", "bidi_ring"};
  state.SetLabel(names[state.range(1)]);
}

// The rendezvous alone: a psum of one float.
constexpr int64_t kSmallCalls = 2000, kCalls = 10;

void record(benchmark::State& state, double seconds, int64_t calls, double* total) {
  state.SetIterationTime(seconds);
  *total += seconds / static_cast<double>(calls);
}

void set_us_per_call(benchmark::State& state, double total) {
  state.counters["us_per_call"] = total / static_cast<double>(state.iterations()) * 1e6;
}

void BM_rendezvous_psum_1_float(benchmark::State& state) {
  double total = 0;
  for (auto _ : state) {
    record(state,
           per_call_seconds(1, kSmallCalls,
                            [](Context& c, const Tensor& t) { return c.psum(t, "x"); }),
           kSmallCalls, &total);
  }
  set_us_per_call(state, total);
}

void BM_psum(benchmark::State& state) {
  const int64_t elems = state.range(0) / 4;
  const CollectiveOptions o = algo(state.range(1));
  double total = 0;
  for (auto _ : state)
    record(state,
           per_call_seconds(elems, kCalls,
                            [&](Context& c, const Tensor& t) { return c.psum(t, "x", o); }),
           kCalls, &total);
  set_us_per_call(state, total);
  state.SetBytesProcessed(state.iterations() * kCalls * state.range(0));
  set_label(state);
}

void BM_all_gather(benchmark::State& state) {
  const int64_t elems = state.range(0) / 4 / 8;
  const CollectiveOptions o = algo(state.range(1));
  double total = 0;
  for (auto _ : state)
    record(state,
           per_call_seconds(
               elems, kCalls,
               [&](Context& c, const Tensor& t) { return c.all_gather(t, "x", 0, true, o); }),
           kCalls, &total);
  set_us_per_call(state, total);
  state.SetBytesProcessed(state.iterations() * kCalls * state.range(0));
  set_label(state);
}

void BM_psum_scatter(benchmark::State& state) {
  const int64_t elems = state.range(0) / 4;
  const CollectiveOptions o = algo(state.range(1));
  double total = 0;
  for (auto _ : state)
    record(state,
           per_call_seconds(
               elems, kCalls,
               [&](Context& c, const Tensor& t) { return c.psum_scatter(t, "x", 0, true, o); }),
           kCalls, &total);
  set_us_per_call(state, total);
  state.SetBytesProcessed(state.iterations() * kCalls * state.range(0));
  set_label(state);
}

void BM_all_to_all(benchmark::State& state) {
  const int64_t elems = state.range(0) / 4;
  const CollectiveOptions o = algo(state.range(1));
  double total = 0;
  for (auto _ : state)
    record(state,
           per_call_seconds(
               elems, kCalls,
               [&](Context& c, const Tensor& t) { return c.all_to_all(t, "x", 0, 0, true, o); }),
           kCalls, &total);
  set_us_per_call(state, total);
  state.SetBytesProcessed(state.iterations() * kCalls * state.range(0));
  set_label(state);
}

void BM_ppermute(benchmark::State& state) {
  const int64_t elems = state.range(0) / 4;
  double total = 0;
  for (auto _ : state) {
    record(state,
           per_call_seconds(elems, kCalls,
                            [](Context& c, const Tensor& t) {
                              return c.ppermute(
                                  t, "x",
                                  {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 0}});
                            }),
           kCalls, &total);
  }
  set_us_per_call(state, total);
  state.SetBytesProcessed(state.iterations() * kCalls * state.range(0));
}

// A whole shard_map call whose body is one psum of one float: placing the inputs, waking the
// devices, the psum, assembling the output (issue 18's launch overhead).
void BM_shard_map_call_psum_1_float(benchmark::State& state) {
  Mesh mesh = make_mesh({8}, {"x"});
  Array x = device_put(std::vector<float>(8, 1.f), {8}, NamedSharding(mesh, P("x")));
  auto f =
      shard_map([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, mesh, {P("x")}, P());
  for (auto _ : state) benchmark::DoNotOptimize(f(x));
}

void sizes_and_algos(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {int64_t{4} << 10, int64_t{256} << 10, int64_t{16} << 20}) {
    for (int64_t a : {0, 1, 2}) b->Args({bytes, a});
  }
}

// A handful of launches each (they are long, and the machine is shared): medians of 5 repetitions.
#define MESHRT_BENCH(b)               \
  b->UseManualTime()                  \
      ->Unit(benchmark::kMillisecond) \
      ->Iterations(3)                 \
      ->Repetitions(5)                \
      ->ReportAggregatesOnly(true)
MESHRT_BENCH(BENCHMARK(BM_rendezvous_psum_1_float));
BENCHMARK(BM_shard_map_call_psum_1_float)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(9)
    ->ReportAggregatesOnly(true);
MESHRT_BENCH(BENCHMARK(BM_psum)->Apply(sizes_and_algos));
MESHRT_BENCH(BENCHMARK(BM_all_gather)->Apply(sizes_and_algos));
MESHRT_BENCH(BENCHMARK(BM_psum_scatter)->Apply(sizes_and_algos));
MESHRT_BENCH(BENCHMARK(BM_all_to_all)->Apply(sizes_and_algos));
MESHRT_BENCH(BENCHMARK(BM_ppermute)->Arg(4 << 10)->Arg(16 << 20));

}  // namespace

int main(int argc, char** argv) {
  set_cpu_device_count(8);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
