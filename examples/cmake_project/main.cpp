// Places a 2-D array on a (2, 2) mesh and reads it back; exit status 0 when the value is intact.
#include <meshrt/meshrt.h>

#include <iostream>
#include <numeric>
#include <vector>

int main() {
  meshrt::set_cpu_device_count(4);
  meshrt::Mesh mesh = meshrt::make_mesh({2, 2}, {"x", "y"});
  std::vector<double> host(24);
  std::iota(host.begin(), host.end(), 0.0);
  meshrt::Array a =
      meshrt::device_put(host, {4, 6}, meshrt::NamedSharding(mesh, meshrt::P("x", "y")));
  std::cout << meshrt::visualize_sharding(a);
  bool ok =
      a.to_vector<double>() == host && a.sharding().shard_shape(a.shape()) == meshrt::Shape{2, 3};
  std::cout << (ok ? "consumer ok" : "consumer FAILED") << "\n";
  return ok ? 0 : 1;
}
