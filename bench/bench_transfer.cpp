// Host -> devices (device_put), devices -> host (to_vector) and resharding, against memcpy of
// the same bytes measured in the same run. Run: ./run.sh bench (8 simulated cpu devices).
#include <benchmark/benchmark.h>
#include <meshrt/meshrt.h>

#include <cstring>
#include <vector>

namespace {

using namespace meshrt;

constexpr int64_t kRows = 2048;

void BM_memcpy_baseline(benchmark::State& state) {
  size_t bytes = static_cast<size_t>(state.range(0)) * kRows * sizeof(float);
  std::vector<char> a(bytes, 1), b(bytes);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_device_put_rows(benchmark::State& state) {
  int64_t cols = state.range(0);
  std::vector<float> host(static_cast<size_t>(kRows * cols), 1.f);
  NamedSharding s(make_mesh({8}, {"x"}), P("x"));
  for (auto _ : state)
    benchmark::DoNotOptimize(device_put(host, {kRows, cols}, s).block_until_ready());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * host.size() * sizeof(float)));
}

void BM_device_put_cols(benchmark::State& state) {
  int64_t cols = state.range(0);
  std::vector<float> host(static_cast<size_t>(kRows * cols), 1.f);
  NamedSharding s(make_mesh({8}, {"x"}), P(None, "x"));
  for (auto _ : state)
    benchmark::DoNotOptimize(device_put(host, {kRows, cols}, s).block_until_ready());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * host.size() * sizeof(float)));
}

void BM_to_vector(benchmark::State& state) {
  int64_t cols = state.range(0);
  std::vector<float> host(static_cast<size_t>(kRows * cols), 1.f);
  Array a =
      device_put(host, {kRows, cols}, NamedSharding(make_mesh({4, 2}, {"x", "y"}), P("x", "y")));
  for (auto _ : state) benchmark::DoNotOptimize(a.to_vector<float>());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * host.size() * sizeof(float)));
}

void BM_reshard_rows_to_cols(benchmark::State& state) {
  int64_t cols = state.range(0);
  std::vector<float> host(static_cast<size_t>(kRows * cols), 1.f);
  Mesh mesh = make_mesh({8}, {"x"});
  Array a = device_put(host, {kRows, cols}, NamedSharding(mesh, P("x")));
  NamedSharding to(mesh, P(None, "x"));
  for (auto _ : state) benchmark::DoNotOptimize(device_put(a, to).block_until_ready());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * host.size() * sizeof(float)));
}

BENCHMARK(BM_memcpy_baseline)->Arg(64)->Arg(2048);
BENCHMARK(BM_device_put_rows)->Arg(64)->Arg(2048);
BENCHMARK(BM_device_put_cols)->Arg(64)->Arg(2048);
BENCHMARK(BM_to_vector)->Arg(64)->Arg(2048);
BENCHMARK(BM_reshard_rows_to_cols)->Arg(64)->Arg(2048);

}  // namespace

int main(int argc, char** argv) {
  set_cpu_device_count(8);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
