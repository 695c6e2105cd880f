// Global-view ops against their hand-written shard_map equivalents, in the same run:
//   TinyOp/global       add(x, x) on an 8-device Array of 8 floats (the per-op overhead)
//   TinyOp/shard_map    the same add as a shard_map body
//   SinLarge/global     2 * sin(x) + 1 with 64 MiB per device (MESHRT_BENCH_MIB overrides)
//   SinLarge/shard_map  the same three ops in one shard_map body
//   SumConstraint       with_sharding_constraint(sum(x, 0), P("x")): one psum_scatter
// Run: MESHRT_CPU_DEVICES=8 build/bench/bench_global --benchmark_repetitions=5
//      --benchmark_report_aggregates_only=true   (compare the medians)
#include <benchmark/benchmark.h>
#include <meshrt/meshrt.h>

#include <cstdlib>
#include <vector>

using namespace meshrt;

namespace {

Mesh mesh8() { return make_mesh({8}, {"x"}); }

Array filled(int64_t per_device) {
  Mesh m = mesh8();
  return full({8 * per_device}, 0.5, DType::f32, NamedSharding(m, P("x")));
}

int64_t large_elems() {
  const char* e = std::getenv("MESHRT_BENCH_MIB");
  const int64_t mib = e ? std::atoll(e) : 64;
  return mib * (1 << 20) / 4;
}

void TinyOpGlobal(benchmark::State& st) {
  Array x = filled(1);
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(add(x, x)));
}
void TinyOpShardMap(benchmark::State& st) {
  Array x = filled(1);
  auto f = shard_map([](Context&, const Tensor& a, const Tensor& b) { return add(a, b); }, mesh8(),
                     {P("x"), P("x")}, P("x"));
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(f(x, x)));
}
void SinLargeGlobal(benchmark::State& st) {
  Array x = filled(large_elems());
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(2.0 * sin(x) + 1.0));
  st.SetBytesProcessed(st.iterations() * 8 * large_elems() * 4);
}
void SinLargeShardMap(benchmark::State& st) {
  Array x = filled(large_elems());
  auto f = shard_map([](Context&, const Tensor& t) { return 2.0 * sin(t) + 1.0; }, mesh8(),
                     {P("x")}, P("x"));
  for (auto _ : st) benchmark::DoNotOptimize(block_until_ready(f(x)));
  st.SetBytesProcessed(st.iterations() * 8 * large_elems() * 4);
}
void SumConstraint(benchmark::State& st) {
  Mesh m = mesh8();
  Array x = full({64, 4096}, 1.0, DType::f32, NamedSharding(m, P("x")));
  for (auto _ : st) {
    benchmark::DoNotOptimize(
        block_until_ready(with_sharding_constraint(sum(x, 0), NamedSharding(m, P("x")))));
  }
}

}  // namespace

BENCHMARK(TinyOpGlobal)->Name("TinyOp/global")->UseRealTime();
BENCHMARK(TinyOpShardMap)->Name("TinyOp/shard_map")->UseRealTime();
BENCHMARK(SinLargeGlobal)->Name("SinLarge/global")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(SinLargeShardMap)
    ->Name("SinLarge/shard_map")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(SumConstraint)->UseRealTime();

int main(int argc, char** argv) {
  if (std::getenv("MESHRT_CPU_DEVICES") == nullptr) set_cpu_device_count(8);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
