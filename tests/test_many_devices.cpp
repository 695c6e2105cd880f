// 256 simulated cpu devices (one executor thread each): collectives over all of them complete
// and are correct. Run with MESHRT_CPU_DEVICES=256 (set by CTest).
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace meshrt {
namespace {

TEST(ManyDevices, PsumOver256Devices) {
  ASSERT_EQ(devices("cpu").size(), 256u);
  Mesh mesh = make_mesh({256}, {"x"});
  std::vector<int64_t> host(256 * 3);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int64_t>(i);
  Array x = device_put(host, {256 * 3}, NamedSharding(mesh, P("x")));
  Array s =
      shard_map([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, mesh, {P("x")}, P())(x);
  std::vector<int64_t> want(3, 0);
  for (size_t i = 0; i < host.size(); ++i) want[i % 3] += host[i];
  EXPECT_EQ(s.to_vector<int64_t>(), want);
}

TEST(ManyDevices, TupleAxesAndGathersOn16x16) {
  Mesh mesh = make_mesh({16, 16}, {"a", "b"});
  std::vector<int32_t> host(256);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int32_t>(i);
  Array x = device_put(host, {16, 16}, NamedSharding(mesh, P("a", "b")));
  auto outs = shard_map(
      [](Context& c, const Tensor& t) {
        Tensor row_sum = c.psum(t, "b");                    // sum over a row of the mesh
        Tensor all = c.all_gather(t, {"b", "a"}, 0, true);  // every element, b-major order
        Tensor total = c.pmax(t, {"a", "b"});
        return std::vector<Tensor>{row_sum, all, total};
      },
      mesh, {P("a", "b")}, {P("a"), P(), P()})(x);
  std::vector<int32_t> rows(16, 0), bmajor, mx{255};
  for (int a = 0; a < 16; ++a) {
    for (int b = 0; b < 16; ++b)
      rows[static_cast<size_t>(a)] += host[static_cast<size_t>(a * 16 + b)];
  }
  for (int b = 0; b < 16; ++b) {
    for (int a = 0; a < 16; ++a) bmajor.push_back(host[static_cast<size_t>(a * 16 + b)]);
  }
  EXPECT_EQ(outs[0].to_vector<int32_t>(), rows);
  // Each device's all_gather result is (256, 1) in group order (b major), i.e. column-major.
  std::vector<int32_t> got = outs[1].to_vector<int32_t>();
  EXPECT_EQ(got, bmajor);
  EXPECT_EQ(outs[2].to_vector<int32_t>(), mx);
}

}  // namespace
}  // namespace meshrt
