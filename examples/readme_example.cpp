// The README's example, verbatim (tests/CMakeLists.txt checks README.md still matches it).
#include <meshrt/meshrt.h>

#include <iostream>
#include <numeric>
using namespace meshrt;

int main() {
  set_cpu_device_count(8);                           // or MESHRT_CPU_DEVICES=8
  Mesh mesh = make_mesh({4, 2}, {"data", "model"});  // device id = 2*data + model
  std::vector<float> host(32);
  std::iota(host.begin(), host.end(), 0.f);
  Array x = device_put(host, {8, 4}, NamedSharding(mesh, P("data", "model")));
  std::cout << visualize_sharding(x);  // jax.debug.visualize_array_sharding
  auto total = shard_map(              // body runs once per device
      [](Context& ctx, const Tensor& block) {
        return ctx.psum(block, {"data", "model"});
      },
      mesh, {P("data", "model")}, P());
  Array s = total(x);                                          // (2, 2): the sum of all 8 blocks
  for (float v : s.to_vector<float>()) std::cout << v << " ";  // 104 112 136 144
  std::cout << "\n";
}
