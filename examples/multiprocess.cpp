// meshrt-multiprocess: the demo's psum and the seed MLP's data-parallel step over every
// process's devices. The same program runs as one process or under mpirun:
//
//   MESHRT_CPU_DEVICES=8 build/examples/meshrt-multiprocess                      # 1 x 8
//   mpirun -np 2 -x MESHRT_CPU_DEVICES=4 build/examples/meshrt-multiprocess      # 2 x 4
//
// Both print the same psum and the same loss; process 0 prints.
#include <meshrt/meshrt.h>

#include <cstdio>
#include <numeric>
#include <vector>

#include "examples/mlp/mlp.h"

using namespace meshrt;

int main() {
  try {
    distributed::initialize();  // a no-op without mpirun
    const bool printer = process_index() == 0;
    const auto n = static_cast<int64_t>(devices("cpu").size());
    if (printer) {
      std::printf("%d process(es) x %zu cpu devices; global devices:", process_count(),
                  local_devices("cpu").size());
      for (const Device& d : devices("cpu")) std::printf(" %s", d.str().c_str());
      std::printf("\n");
    }
    // The demo's psum: device i holds [i, i+1, i+2]; the sum over the mesh axis.
    Mesh mesh = make_mesh({n}, {"batch"}, "cpu");
    std::vector<int32_t> v(static_cast<size_t>(3 * n));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < 3; ++e)
        v[static_cast<size_t>(3 * i + e)] = static_cast<int32_t>(i + e);
    Array x = device_put(v, {3 * n}, NamedSharding(mesh, P("batch")));
    Array s = shard_map([](Context& c, const Tensor& t) { return c.psum(t, "batch"); }, mesh,
                        {P("batch")}, P())(x);
    const std::vector<int32_t> sum = s.to_vector<int32_t>();  // replicated: every process reads it
    if (printer)
      std::printf("psum over %lld devices: [%d, %d, %d]\n", static_cast<long long>(n), sum[0],
                  sum[1], sum[2]);

    // The seed MLP: one data-parallel loss-and-grad step per iteration, batch 32 over the mesh,
    // checked against the same step on one device of this process.
    mlp::Problem p = mlp::init(random::key(0), {784, 128, 128, 128, 128, 128, 8}, 32);
    const Mesh one({local_devices("cpu")[0]}, {1}, {"one"});
    for (int step = 0; step < 3; ++step) {
      const mlp::Grads dp = mlp::loss_and_grad(p, mlp::Strategy::data_parallel, mesh);
      const mlp::Grads ref = mlp::loss_and_grad(p, mlp::Strategy::single, one);
      if (printer) {
        std::printf("step %d: data-parallel loss %.6f (one device %.6f, max rel diff %.1e)\n", step,
                    dp.loss, ref.loss, mlp::max_rel_diff(dp, ref));
      }
      mlp::sgd_step(p, dp, 0.001f);  // the tests' rate: 0.01 overshoots on this problem
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "meshrt-multiprocess (process %d): error: %s\n", process_index(),
                 e.what());
    return 1;
  }
}
