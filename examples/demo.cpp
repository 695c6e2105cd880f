// meshrt walkthrough: devices, meshes, shardings, where the blocks went, and resharding.
// Run it with ./run.sh demo (8 simulated cpu devices).
#include <meshrt/meshrt.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

using namespace meshrt;

namespace {

std::string range_str(const Index& idx) {
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(idx[d].first) + ":" + std::to_string(idx[d].second);
  }
  return s + "]";
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
    if (cols > 0 && i % static_cast<size_t>(cols) == 0) s += i ? "] [" : "[";
    else s += " ";
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

}  // namespace

int main() {
  std::printf("== meshrt demo\nplatforms:");
  for (const std::string& p : platforms()) std::printf(" %s", p.c_str());
  std::printf("\ncpu devices:");
  for (const Device& d : devices("cpu")) std::printf(" %s", d.str().c_str());
  std::printf("\n\n== Part 1: meshes and shardings (jax.debug.visualize_array_sharding layout)\n\n");

  Mesh m8 = make_mesh({8}, {"data"});
  show(m8, P(), {8});
  show(m8, P("data"), {8});
  show(m8, P("data", None), {8, 4});
  show(m8, P(None, "data"), {2, 16});
  for (Shape ms : {Shape{4, 2}, Shape{2, 4}}) {
    Mesh mesh = make_mesh(ms, {"data", "model"});
    for (const PartitionSpec& spec :
         {P(), P("data", None), P(None, "model"), P("data", "model"), P(Axes{"data", "model"}, None),
          P(Axes{"model", "data"}), P("model", "data")}) {
      show(mesh, spec, {8, 4});
    }
  }

  std::printf("== Resharding moves only the blocks that must move\n\n");
  Mesh mesh = make_mesh({4, 2}, {"data", "model"});
  std::vector<float> host(64);
  std::iota(host.begin(), host.end(), 0.0f);
  Array a = device_put(host, {8, 8}, NamedSharding(mesh, P("data", None)));
  for (const PartitionSpec& to : {P("data", "model"), P("data", None), P("model", "data"), P()}) {
    Array b = device_put(a, NamedSharding(mesh, to));
    int shared = 0;
    for (size_t i = 0; i < b.blocks().size(); ++i) shared += b.blocks()[i].buffer() == a.blocks()[i].buffer();
    bool same = b.to_vector<float>() == host;
    std::printf("   %s -> %-14s blocks kept in place: %d/8, value preserved: %s\n",
                P("data", None).str().c_str(), to.str().c_str(), shared, same ? "yes" : "NO");
  }
  return 0;
}
