// Tensors and Arrays: host round trips (property style), resharding between every pair of a set
// of shardings, what resharding moves, memory alignment and lifetime, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <typeinfo>

#include "backends/backend.h"
#include "runtime/detail/access.h"
#include "runtime/detail/copy.h"
#include "tests/test_util.h"

namespace meshrt {
namespace {

using test::host_slice;

template <class T>
std::vector<T> random_values(size_t n, std::mt19937& rng) {
  std::vector<T> v(n);
  std::uniform_int_distribution<int64_t> dist(-1000000, 1000000);
  for (auto& x : v) {
    if constexpr (std::is_floating_point_v<T>) {
      x = static_cast<T>(dist(rng)) / T(7);
    } else {
      x = static_cast<T>(dist(rng));
    }
  }
  return v;
}

// Checks every block against the host reference and the global read-back.
template <class T>
void check_array(const Array& a, const std::vector<T>& host, const Shape& shape,
                 const std::string& what) {
  EXPECT_EQ(a.shape(), shape) << what;
  EXPECT_EQ(a.dtype(), dtype_v<T>) << what;
  EXPECT_EQ(a.to_vector<T>(), host) << what;
  for (const Shard& s : a.addressable_shards()) {
    EXPECT_EQ(s.data.device(), s.device) << what;
    EXPECT_EQ(s.data.to_vector<T>(), host_slice(host, shape, s.index))
        << what << " on " << s.device.str();
  }
}

struct MeshChoice {
  Shape shape;
  std::vector<std::string> names;
};

const std::vector<MeshChoice> kMeshes = {
    {{8}, {"x"}},         {{4, 2}, {"x", "y"}}, {{2, 4}, {"x", "y"}}, {{2, 2, 2}, {"x", "y", "z"}},
    {{1, 8}, {"x", "y"}}, {{3}, {"x"}},         {{2, 3}, {"x", "y"}}, {{1}, {"x"}},
    {{5}, {"x"}}};

// Random spec for `rank` dims over the mesh, with each axis used at most once.
PartitionSpec random_spec(const MeshChoice& m, size_t rank, std::mt19937& rng) {
  std::vector<PartitionSpec::Entry> entries(rank);
  std::vector<std::string> names = m.names;
  std::shuffle(names.begin(), names.end(), rng);
  for (const std::string& n : names) {
    int where = static_cast<int>(rng() % (rank + 1));  // rank = unused
    if (where < static_cast<int>(rank)) entries[static_cast<size_t>(where)].push_back(n);
  }
  size_t len = rank == 0 ? 0 : rng() % (rank + 1);  // trailing dims may be left out
  for (size_t d = len; d < rank; ++d) {
    if (!entries[d].empty()) len = d + 1;
  }
  entries.resize(len);
  return PartitionSpec(entries);
}

template <class T>
void round_trips(int cases, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int c = 0; c < cases; ++c) {
    const MeshChoice& mc = kMeshes[rng() % kMeshes.size()];
    Mesh mesh = make_mesh(mc.shape, mc.names);
    size_t rank = rng() % 5;
    PartitionSpec spec = random_spec(mc, rank, rng);
    NamedSharding sharding(mesh, spec);
    Shape shape(rank);
    for (size_t d = 0; d < rank; ++d) {
      int64_t t = 1;
      for (const std::string& a : spec[d]) t *= mesh.axis_size(a);
      shape[d] = t * static_cast<int64_t>(rng() % 4);  // includes size-0 dimensions
      if (rng() % 3 == 0) shape[d] = t;                // and size-1 blocks
    }
    auto host = random_values<T>(static_cast<size_t>(shape_size(shape)), rng);
    Array a = device_put(host, shape, sharding);
    check_array(a, host, shape, mesh.str() + " " + spec.str() + " " + shape_str(shape));
  }
}

TEST(RoundTrip, Float32) { round_trips<float>(150, 1); }
TEST(RoundTrip, Float64) { round_trips<double>(150, 2); }
TEST(RoundTrip, Int32) { round_trips<int32_t>(150, 3); }
TEST(RoundTrip, Int64) { round_trips<int64_t>(150, 4); }

TEST(Reshard, EveryPairOfShardings) {
  auto devs = devices();
  Mesh m42 = make_mesh({4, 2}, {"x", "y"});
  Mesh m24 = make_mesh({2, 4}, {"x", "y"});
  Mesh m8 = make_mesh({8}, {"x"});
  Mesh rev({devs[7], devs[6], devs[5], devs[4], devs[3], devs[2], devs[1], devs[0]}, {8}, {"x"});
  Mesh m4({devs[4], devs[5], devs[6], devs[7]}, {2, 2}, {"a", "b"});
  std::vector<Sharding> shardings = {
      NamedSharding(m42, P()),          NamedSharding(m42, P("x")),
      NamedSharding(m42, P("x", "y")),  NamedSharding(m42, P("y", "x")),
      NamedSharding(m42, P(None, "y")), NamedSharding(m42, P(Axes{"y", "x"})),
      NamedSharding(m24, P("x", "y")),  NamedSharding(m24, P(Axes{"x", "y"}, None)),
      NamedSharding(m8, P("x")),        NamedSharding(m8, P(None, "x")),
      NamedSharding(rev, P("x")),       NamedSharding(m4, P("a", "b")),
      SingleDeviceSharding(devs[3]),    SingleDeviceSharding(devs[0])};
  const Shape shape{8, 8};
  std::mt19937 rng(7);
  auto host = random_values<float>(64, rng);
  int pairs = 0;
  for (const Sharding& from : shardings) {
    Array a = device_put(host, shape, from);
    for (const Sharding& to : shardings) {
      Array b = device_put(a, to);
      check_array(b, host, shape, from.str() + " -> " + to.str());
      EXPECT_TRUE(b.sharding().is_equivalent_to(to, shape));
      ++pairs;
    }
  }
  EXPECT_EQ(pairs, 196);
}

TEST(Reshard, KeepsBlocksThatStay) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  std::vector<int32_t> host(64);
  std::iota(host.begin(), host.end(), 0);
  Array a = device_put(host, {8, 8}, NamedSharding(mesh, P("x")));
  // P("x", None) describes the same placement: every block is shared, nothing is copied.
  auto& stats = detail::copy_stats();
  int64_t local0 = stats.local_bytes, cross0 = stats.cross_device_bytes;
  Array b = device_put(a, NamedSharding(mesh, P("x", None)));
  EXPECT_EQ(stats.local_bytes - local0, 0);
  EXPECT_EQ(stats.cross_device_bytes - cross0, 0);
  for (size_t i = 0; i < 8; ++i)
    EXPECT_EQ(detail::TensorAccess::buffer(detail::ArrayAccess::blocks(b)[i]),
              detail::TensorAccess::buffer(detail::ArrayAccess::blocks(a)[i]));

  // P("x") -> P("x", "y"): each device already holds what it needs; only local copies.
  Array c = device_put(a, NamedSharding(mesh, P("x", "y")));
  EXPECT_EQ(stats.cross_device_bytes - cross0, 0);
  EXPECT_EQ(stats.local_bytes - local0, 64 * 4);  // 8 blocks of 2x4 int32
  // P("x", "y") -> P("x"): each device fetches the other half of its rows from its y-peer.
  int64_t local1 = stats.local_bytes, cross1 = stats.cross_device_bytes;
  Array d = device_put(c, NamedSharding(mesh, P("x")));
  EXPECT_EQ(stats.local_bytes - local1, 8 * 8 * 4);         // own half: 8 devices x 8 int32
  EXPECT_EQ(stats.cross_device_bytes - cross1, 8 * 8 * 4);  // the peer's half, same amount
  EXPECT_EQ(d.to_vector<int32_t>(), host);
}

TEST(Tensor, AlignmentAndLifetime) {
  Device dev = devices()[2];
  std::weak_ptr<backend::Buffer> weak;
  {
    Tensor t = tensor(std::vector<double>{1, 2, 3}, {3}, dev);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
    EXPECT_EQ(t.device(), dev);
    EXPECT_EQ(t.str(),
              std::string("Tensor(float64(3,) on ") + test::dev_name(2) + std::string(")"));
    weak = detail::TensorAccess::buffer(t);
    Tensor copy = t;  // shares memory
    EXPECT_EQ(copy.data(), t.data());
  }
  EXPECT_TRUE(weak.expired());  // freed with the last reference
  Mesh mesh = make_mesh({8}, {"x"});
  std::vector<std::weak_ptr<backend::Buffer>> blocks;
  {
    Array a = device_put(std::vector<float>(64, 1.f), {64}, NamedSharding(mesh, P("x")));
    for (const Tensor& b : detail::ArrayAccess::blocks(a)) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
      blocks.push_back(detail::TensorAccess::buffer(b));
    }
    Tensor kept = detail::ArrayAccess::blocks(a)[5];
    a = Array();
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(blocks[i].expired(), i != 5) << i;
  }
  for (auto& w : blocks) EXPECT_TRUE(w.expired());
}

// cpu <-> cuda moves are explicit device_puts (small copies, and large ones through pinned
// staging); an implicit mix is an error naming both platforms and the device_put to use.
TEST(CrossPlatform, ExplicitMovesRoundTripAndImplicitMixesAreErrors) {
  auto ps = platforms();
  if (std::find(ps.begin(), ps.end(), "cuda") == ps.end())
    GTEST_SKIP() << "no usable cuda platform here";
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(devices("cuda").size()), 4);
  Mesh cpu_mesh = make_mesh({n}, {"x"}, "cpu");
  Mesh gpu_mesh = make_mesh({n}, {"x"}, "cuda");
  for (int64_t per : {int64_t{3}, int64_t{5} << 20}) {  // 12 bytes, and 20 MiB per device
    std::vector<float> host(static_cast<size_t>(per * n));
    std::iota(host.begin(), host.end(), 0.f);
    Array a = device_put(host, {per * n}, NamedSharding(cpu_mesh, P("x")));
    Array g = device_put(a, NamedSharding(gpu_mesh, P("x")));  // cpu -> cuda
    EXPECT_EQ(g.sharding().platform(), "cuda");
    Array r = device_put(g, NamedSharding(gpu_mesh, P()));        // resharded on cuda
    Array back = device_put(r, NamedSharding(cpu_mesh, P("x")));  // cuda -> cpu
    EXPECT_EQ(back.sharding().platform(), "cpu");
    EXPECT_EQ(back.to_vector<float>(), host);
    EXPECT_EQ(g.to_vector<float>(), host);
    EXPECT_EQ(device_put(host, {per * n}, NamedSharding(gpu_mesh, P("x"))).to_vector<float>(),
              host);
  }
  Array a = device_put(std::vector<float>(static_cast<size_t>(n), 1.f), {n},
                       NamedSharding(cpu_mesh, P("x")));
  EXPECT_MESHRT_ERROR(
      shard_map([](Context&, const Tensor& t) { return t; }, gpu_mesh, {P("x")}, P("x"))(a),
      "[shard_map] args[0] lives on the cpu platform but the mesh is on cuda",
      "device_put(x, NamedSharding(mesh, in_specs[0]))");
  Tensor tc = tensor(std::vector<float>{1, 2}, {2}, devices("cpu")[0]);
  Tensor tg = tensor(std::vector<float>{1, 2}, {2}, devices("cuda")[0]);
  EXPECT_MESHRT_ERROR(add(tc, tg), "[ops] add", "cpu:0 and cuda:0", "different platforms",
                      "device_put");
}

TEST(Tensor, RankZeroAndEmpty) {
  Device dev = devices()[0];
  Tensor s = tensor(std::vector<int64_t>{42}, {}, dev);
  EXPECT_EQ(s.size(), 1);
  EXPECT_EQ(s.to_vector<int64_t>(), std::vector<int64_t>{42});
  Tensor e = tensor(std::vector<float>{}, {0, 5}, dev);
  EXPECT_EQ(e.size(), 0);
  EXPECT_TRUE(e.to_vector<float>().empty());
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  Array a = device_put(std::vector<int32_t>{7}, {}, NamedSharding(mesh, P()));
  EXPECT_EQ(a.to_vector<int32_t>(), std::vector<int32_t>{7});
  EXPECT_EQ(a.addressable_shards().size(), 8u);
}

TEST(ArrayErrors, BadInput) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  NamedSharding rows(mesh, P("x"));
  std::vector<float> ten(10);
  EXPECT_MESHRT_ERROR(device_put(ten, {4, 2}, rows), "[device_put]", "host data has 10 elements",
                      "shape (4, 2) needs 8");
  EXPECT_MESHRT_ERROR(device_put(ten, {10}, rows),
                      "[device_put] the target sharding NamedSharding(mesh=Mesh('x': 4, 'y': 2), "
                      "spec=P('x',)) implies that array axis 0 is partitioned 4 times, but the "
                      "dimension size is 10");
  EXPECT_MESHRT_ERROR(device_put(std::vector<float>(8), {8}, NamedSharding(mesh, P("x", "y"))),
                      "[device_put]", "rank at least 2");
  Array a = device_put(std::vector<float>(8), {8}, rows);
  EXPECT_MESHRT_ERROR(a.to_vector<int32_t>(), "[array]",
                      "to_vector<int32_t> called on a float32 array", "use to_vector<float>");
  EXPECT_MESHRT_ERROR(detail::ArrayAccess::blocks(a)[0].to_vector<double>(), "[tensor]",
                      "use to_vector<float>");
  EXPECT_MESHRT_ERROR(device_put(a, NamedSharding(mesh, P("y", "x"))), "[device_put]",
                      "rank at least 2");
  EXPECT_MESHRT_ERROR(tensor(ten, {3, 3}, devices()[0]), "[tensor]", "host data has 10 elements");
  EXPECT_MESHRT_ERROR(tensor(ten, {-10}, devices()[0]), "negative dimension");
  EXPECT_MESHRT_ERROR(Array().to_vector<float>(), "[array]");
  EXPECT_MESHRT_ERROR(detail::ArrayAccess::make({8}, DType::f32, rows, {}), "[array]", "0 blocks");
}

// ---- conveniences a C++ user reaches for: printing, item(), the empty Array, scalar types

template <class T>
std::string printed(const T& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

TEST(Print, EveryPublicValueType) {
  Mesh mesh = make_mesh({2}, {"x"});
  EXPECT_EQ(printed(DType::f32), "float32");
  EXPECT_EQ(printed(DType::bool_), "bool");
  EXPECT_EQ(printed(mesh.devices()[1]), mesh.devices()[1].str());
  EXPECT_EQ(printed(mesh), "Mesh('x': 2)");
  EXPECT_EQ(printed(P("x", None)), "P('x', None)");
  EXPECT_EQ(printed(NamedSharding(mesh, P("x"))), "NamedSharding(mesh=Mesh('x': 2), spec=P('x',))");
  EXPECT_EQ(printed(SingleDeviceSharding(mesh.devices()[0])),
            "SingleDeviceSharding(device=" + mesh.devices()[0].str() + ")");
  Array a = device_put(std::vector<float>{0, 1.5f, 2, 3}, {2, 2}, NamedSharding(mesh, P("x")));
  EXPECT_EQ(printed(a),
            "Array(float32(2, 2), sharding=NamedSharding(mesh=Mesh('x': 2), spec=P('x',)), "
            "values=[[0., 1.5], [2., 3.]])");
  Array i = device_put(std::vector<int32_t>{7}, {}, NamedSharding(mesh, P()));
  EXPECT_EQ(printed(i),
            "Array(int32(), sharding=NamedSharding(mesh=Mesh('x': 2), spec=P()), values=7)");
  Array b =
      device_put(std::vector<bool>{true, false}, {2}, SingleDeviceSharding(mesh.devices()[0]));
  EXPECT_NE(printed(b).find("values=[true, false]"), std::string::npos) << printed(b);
  // Large values print without them (as JAX summarises), small Tensors with them.
  Array big = device_put(std::vector<double>(101, 1.0), {101}, NamedSharding(mesh, P()));
  EXPECT_EQ(printed(big), "Array(float64(101,), sharding=" + big.sharding().str() + ")");
  EXPECT_EQ(printed(detail::ArrayAccess::blocks(a)[1]),
            "Tensor(float32(1, 2) on " + mesh.devices()[1].str() + ", [[2., 3.]])");
  EXPECT_EQ(printed(Array()), "Array(empty)");
  EXPECT_EQ(printed(Tensor()), "Tensor(empty)");
  // A pending sum prints as such, and its values are the sum's.
  Array s = sum(a, 0);
  ASSERT_FALSE(s.pending_sum_axes().empty());
  EXPECT_EQ(printed(s),
            "Array(float32(2,), sharding=NamedSharding(mesh=Mesh('x': 2), spec=P()), pending sum "
            "over ('x',), values=[2., 4.5])");
}

TEST(Item, OneElementValues) {
  Mesh mesh = make_mesh({2}, {"x"});
  Array loss = device_put(std::vector<float>{2.5f}, {}, NamedSharding(mesh, P()));
  EXPECT_EQ(loss.item<float>(), 2.5f);
  Array one = device_put(std::vector<int64_t>{-3}, {1, 1}, NamedSharding(mesh, P()));
  EXPECT_EQ(one.item<int64_t>(), -3);
  Array x = device_put(std::vector<double>{1, 2, 3, 4}, {4}, NamedSharding(mesh, P("x")));
  EXPECT_EQ(sum(x).item<double>(), 10.0);  // a pending sum is taken first
  EXPECT_MESHRT_ERROR(x.item<double>(), "[array] item() needs an Array of exactly one element",
                      "float64(4,)", "has 4");
  EXPECT_MESHRT_ERROR(loss.item<double>(), "use to_vector<float>");
  EXPECT_MESHRT_ERROR(Array().item<float>(), "[array] item() of an empty");
  Tensor t = detail::ArrayAccess::blocks(loss)[0];
  EXPECT_EQ(t.item<float>(), 2.5f);
  EXPECT_MESHRT_ERROR(detail::ArrayAccess::blocks(x)[0].item<double>(),
                      "[tensor] item() needs a tensor of exactly", "has 2");
  EXPECT_MESHRT_ERROR(Tensor().item<float>(), "[tensor] item() of an empty");
}

TEST(EmptyArray, IsExplicitAndEveryUseSaysSo) {
  Array e;
  EXPECT_FALSE(e.valid());
  EXPECT_EQ(e.size(), 0);  // not 1: an empty Array is not a scalar
  EXPECT_TRUE(e.shape().empty());
  Mesh mesh = make_mesh({2}, {"x"});
  Array x = device_put(std::vector<float>{1, 2}, {2}, NamedSharding(mesh, P("x")));
  EXPECT_TRUE(x.valid());
  EXPECT_EQ(x.size(), 2);
  Array scalar = device_put(std::vector<float>{1}, {}, NamedSharding(mesh, P()));
  EXPECT_TRUE(scalar.valid());
  EXPECT_EQ(scalar.size(), 1);
  EXPECT_MESHRT_ERROR(e.addressable_shards(), "[array] addressable_shards of an empty");
  EXPECT_MESHRT_ERROR(e.to_vector<float>(), "empty (default-constructed) Array");
  EXPECT_MESHRT_ERROR(e.device(), "empty (default-constructed) Array");
  EXPECT_MESHRT_ERROR(e + 1.0, "[add]", "empty");
  EXPECT_MESHRT_ERROR(x * e, "[multiply]", "empty");
  EXPECT_MESHRT_ERROR(sum(e), "[sum]", "empty");
  EXPECT_MESHRT_ERROR(device_put(e, NamedSharding(mesh, P())), "[device_put]", "empty");
  e = x;  // a placeholder takes a value later
  EXPECT_TRUE(e.valid());
}

// `x / v.size()` and every other arithmetic type are weak scalars, on Arrays and Tensors alike.
template <class S>
void check_scalar_type(const Array& x, const Tensor& t, S s, bool integral) {
  static_assert(requires(Array y) {
    x / s;
    s* x;
    x + s;
    y -= s;
    t / s;
    s - t;
    t < s;
  });
  const Scalar w = s;
  EXPECT_EQ(w.integral, integral) << typeid(S).name();
  EXPECT_EQ(w.value, 2.0);
  const Array q = x / s;
  EXPECT_EQ(q.to_vector<float>(), (std::vector<float>{0.5f, 1.f, 1.5f, 2.f}));
  EXPECT_EQ((s * x).dtype(), DType::f32);  // weak: the Array's dtype
  const Tensor r = t / s;
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0.5f, 1.f}));
}

TEST(WeakScalar, EveryArithmeticType) {
  Mesh mesh = make_mesh({2}, {"x"});
  Array x = device_put(std::vector<float>{1, 2, 3, 4}, {4}, NamedSharding(mesh, P("x")));
  const Tensor& t = detail::ArrayAccess::blocks(x)[0];
  std::vector<float> v(2);
  EXPECT_EQ((x / v.size()).to_vector<float>(), (std::vector<float>{0.5f, 1.f, 1.5f, 2.f}));
  check_scalar_type(x, t, 2, true);
  check_scalar_type(x, t, 2L, true);
  check_scalar_type(x, t, 2LL, true);
  check_scalar_type(x, t, 2U, true);
  check_scalar_type(x, t, size_t{2}, true);
  check_scalar_type(x, t, int16_t{2}, true);
  check_scalar_type(x, t, 2.f, false);
  check_scalar_type(x, t, 2.0, false);
  // An integer scalar keeps an integer array's dtype; a float one makes it float64 (JAX x64).
  Array n = device_put(std::vector<int32_t>{4, 6}, {2}, NamedSharding(mesh, P("x")));
  EXPECT_EQ((n + size_t{1}).dtype(), DType::i32);
  EXPECT_EQ((n + size_t{1}).to_vector<int32_t>(), (std::vector<int32_t>{5, 7}));
  EXPECT_EQ((n + 1.f).dtype(), DType::f64);
  EXPECT_EQ((n + true).to_vector<int32_t>(), (std::vector<int32_t>{5, 7}));  // bool: 0 or 1
}

}  // namespace
}  // namespace meshrt
