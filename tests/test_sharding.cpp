// Meshes, PartitionSpecs and NamedSharding against JAX's rules: hand-derived tables of every
// device's block on (4, 2), (2, 4) and (8,) meshes (devices in jax.make_mesh's order), and 700+
// cases generated with JAX itself (tests/data/gen_sharding.py).
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "tests/test_util.h"

namespace meshrt {
namespace {

using test::parse_shape;
using test::parse_spec;
using test::split;
using test::trim;

// "[0:2,:]" -> index for shape (8, 4).
Index parse_cell(std::string cell, const Shape& shape) {
  cell = cell.substr(1, cell.size() - 2);
  Index idx;
  auto parts = split(cell, ',');
  for (size_t d = 0; d < parts.size(); ++d) {
    if (parts[d] == ":") {
      idx.emplace_back(0, shape[d]);
    } else {
      auto ab = split(parts[d], ':');
      idx.emplace_back(std::stoll(ab[0]), std::stoll(ab[1]));
    }
  }
  return idx;
}

struct TableRow {
  PartitionSpec spec;
  Shape block;
  std::vector<std::string> cells;  // D0..D7
};

void check_table(const Mesh& mesh, const Shape& shape, const std::vector<TableRow>& rows) {
  for (const TableRow& r : rows) {
    NamedSharding s(mesh, r.spec);
    EXPECT_EQ(s.shard_shape(shape), r.block) << r.spec.str();
    auto map = s.devices_indices_map(shape);
    ASSERT_EQ(map.size(), 8u);
    for (size_t k = 0; k < 8; ++k) {
      EXPECT_EQ(map[k].first.local_index(), static_cast<int>(k));
      EXPECT_EQ(map[k].second, parse_cell(r.cells[k], shape))
          << mesh.str() << " " << r.spec.str() << " D" << k;
    }
  }
}

TEST(ShardingTables, Mesh4x2) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  check_table(
      mesh, {8, 4},
      {
          {P("x"),
           {2, 4},
           {"[0:2,:]", "[0:2,:]", "[2:4,:]", "[2:4,:]", "[4:6,:]", "[4:6,:]", "[6:8,:]",
            "[6:8,:]"}},
          {P("x", "y"),
           {2, 2},
           {"[0:2,0:2]", "[0:2,2:4]", "[2:4,0:2]", "[2:4,2:4]", "[4:6,0:2]", "[4:6,2:4]",
            "[6:8,0:2]", "[6:8,2:4]"}},
          {P(Axes{"x", "y"}),
           {1, 4},
           {"[0:1,:]", "[1:2,:]", "[2:3,:]", "[3:4,:]", "[4:5,:]", "[5:6,:]", "[6:7,:]",
            "[7:8,:]"}},
          {P(Axes{"y", "x"}),
           {1, 4},
           {"[0:1,:]", "[4:5,:]", "[1:2,:]", "[5:6,:]", "[2:3,:]", "[6:7,:]", "[3:4,:]",
            "[7:8,:]"}},
          {P(None, "y"),
           {8, 2},
           {"[:,0:2]", "[:,2:4]", "[:,0:2]", "[:,2:4]", "[:,0:2]", "[:,2:4]", "[:,0:2]",
            "[:,2:4]"}},
          {P("y"),
           {4, 4},
           {"[0:4,:]", "[4:8,:]", "[0:4,:]", "[4:8,:]", "[0:4,:]", "[4:8,:]", "[0:4,:]",
            "[4:8,:]"}},
          {P("y", "x"),
           {4, 1},
           {"[0:4,0:1]", "[4:8,0:1]", "[0:4,1:2]", "[4:8,1:2]", "[0:4,2:3]", "[4:8,2:3]",
            "[0:4,3:4]", "[4:8,3:4]"}},
          {P(), {8, 4}, {"[:,:]", "[:,:]", "[:,:]", "[:,:]", "[:,:]", "[:,:]", "[:,:]", "[:,:]"}},
      });
}

TEST(ShardingTables, Mesh2x4) {
  Mesh mesh = make_mesh({2, 4}, {"x", "y"});
  check_table(
      mesh, {8, 4},
      {
          {P("x"),
           {4, 4},
           {"[0:4,:]", "[0:4,:]", "[0:4,:]", "[0:4,:]", "[4:8,:]", "[4:8,:]", "[4:8,:]",
            "[4:8,:]"}},
          {P("x", "y"),
           {4, 1},
           {"[0:4,0:1]", "[0:4,1:2]", "[0:4,2:3]", "[0:4,3:4]", "[4:8,0:1]", "[4:8,1:2]",
            "[4:8,2:3]", "[4:8,3:4]"}},
          {P(Axes{"x", "y"}),
           {1, 4},
           {"[0:1,:]", "[1:2,:]", "[2:3,:]", "[3:4,:]", "[4:5,:]", "[5:6,:]", "[6:7,:]",
            "[7:8,:]"}},
          {P(Axes{"y", "x"}),
           {1, 4},
           {"[0:1,:]", "[2:3,:]", "[4:5,:]", "[6:7,:]", "[1:2,:]", "[3:4,:]", "[5:6,:]",
            "[7:8,:]"}},
          {P(None, "y"),
           {8, 1},
           {"[:,0:1]", "[:,1:2]", "[:,2:3]", "[:,3:4]", "[:,0:1]", "[:,1:2]", "[:,2:3]",
            "[:,3:4]"}},
          {P("y", "x"),
           {2, 2},
           {"[0:2,0:2]", "[2:4,0:2]", "[4:6,0:2]", "[6:8,0:2]", "[0:2,2:4]", "[2:4,2:4]",
            "[4:6,2:4]", "[6:8,2:4]"}},
          {P(), {8, 4}, {"[:,:]", "[:,:]", "[:,:]", "[:,:]", "[:,:]", "[:,:]", "[:,:]", "[:,:]"}},
      });
}

TEST(ShardingTables, Mesh8) {
  Mesh mesh = make_mesh({8}, {"x"});
  NamedSharding rows(mesh, P("x"));
  EXPECT_EQ(rows.shard_shape({8, 4}), (Shape{1, 4}));
  EXPECT_EQ(rows.shard_shape({16}), (Shape{2}));
  auto m = rows.devices_indices_map({16});
  for (int k = 0; k < 8; ++k) EXPECT_EQ(m[k].second, (Index{{2 * k, 2 * k + 2}}));
  EXPECT_MESHRT_ERROR(NamedSharding(mesh, P(None, "x")).shard_shape({8, 4}), "[sharding]",
                      "array axis 1 is partitioned 8 times", "dimension size is 4");
  auto cols = NamedSharding(mesh, P(None, "x")).devices_indices_map({2, 16});
  for (int k = 0; k < 8; ++k) EXPECT_EQ(cols[k].second, (Index{{0, 2}, {2 * k, 2 * k + 2}}));
  for (const Shape& s : {Shape{}, Shape{5}, Shape{3, 7}}) {
    for (auto& [d, idx] : NamedSharding(mesh, P()).devices_indices_map(s)) {
      for (size_t i = 0; i < s.size(); ++i)
        EXPECT_EQ(idx[i], (std::pair<int64_t, int64_t>(0, s[i])));
    }
  }
}

// Every line of tests/data/sharding_expected.txt, produced by JAX 0.10 (gen_sharding.py).
TEST(ShardingJax, GeneratedCasesMatchJax) {
  std::string text = test::read_data_file("sharding_expected.txt");
  int checked = 0, errors = 0;
  std::map<std::string, Mesh> meshes;
  for (const std::string& line : split(text, '\n')) {
    if (line.empty()) continue;
    size_t bar = line.rfind(" | ");
    std::string head = line.substr(0, bar), result = line.substr(bar + 3);
    std::map<std::string, std::string> kv;
    for (const std::string& tok : split(head, ' ')) {
      size_t eq = tok.find('=');
      kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
    Shape msizes = parse_shape(kv["mesh"]);
    auto names = split(kv["names"], ',');
    Mesh mesh = make_mesh(msizes, names);
    Shape shape = parse_shape(kv["shape"]);
    NamedSharding s(mesh, parse_spec(kv["spec"]));
    if (result == "error") {
      EXPECT_THROW(s.devices_indices_map(shape), Error) << line;
      ++errors;
      continue;
    }
    auto devs = split(result, ';');
    auto map = s.devices_indices_map(shape);
    ASSERT_EQ(map.size(), devs.size()) << line;
    for (size_t k = 0; k < devs.size(); ++k) {
      Index want;
      std::string cell = trim(devs[k]);
      if (!cell.empty()) {
        for (const std::string& r : split(cell, ',')) {
          auto ab = split(r, ':');
          want.emplace_back(std::stoll(ab[0]), std::stoll(ab[1]));
        }
      }
      EXPECT_EQ(map[k].first, mesh.devices()[k]) << line;
      EXPECT_EQ(map[k].second, want) << line << " device " << k;
    }
    ++checked;
  }
  EXPECT_GT(checked, 700);
  EXPECT_GT(errors, 900);
}

TEST(PartitionSpec, ReprAndCanonicalForm) {
  EXPECT_EQ(P().str(), "P()");
  EXPECT_EQ(P("x").str(), "P('x',)");
  EXPECT_EQ(P("x", "y").str(), "P('x', 'y')");
  EXPECT_EQ(P(Axes{"x", "y"}).str(), "P(('x', 'y'),)");
  EXPECT_EQ(P(None, "y").str(), "P(None, 'y')");
  EXPECT_EQ(P("x", None).str(), "P('x', None)");
  EXPECT_EQ(P(Axes{"x"}), P("x"));  // a 1-tuple is the name itself
  EXPECT_EQ(P(Axes{}), P(None));    // an empty tuple is None
  EXPECT_EQ(P(std::string("x")), P("x"));
  EXPECT_NE(P("x", None), P("x"));  // trailing None kept ...
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  EXPECT_TRUE(
      NamedSharding(mesh, P("x", None)).is_equivalent_to(NamedSharding(mesh, P("x")), {8, 4}));
  EXPECT_FALSE(NamedSharding(mesh, P("x")).is_equivalent_to(NamedSharding(mesh, P("y")), {8, 4}));
  EXPECT_EQ(P("x", Axes{"y", "z"}).axes(), (std::vector<std::string>{"x", "y", "z"}));
}

TEST(Sharding, FullyReplicatedAndPlatform) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  EXPECT_TRUE(NamedSharding(mesh, P()).is_fully_replicated());
  EXPECT_FALSE(NamedSharding(mesh, P("x")).is_fully_replicated());
  Mesh ones = make_mesh({1, 8}, {"a", "b"});
  EXPECT_TRUE(NamedSharding(ones, P("a")).is_fully_replicated());  // size-1 axis splits nothing
  EXPECT_FALSE(NamedSharding(ones, P("b")).is_fully_replicated());
  SingleDeviceSharding single(devices()[3]);
  EXPECT_TRUE(single.is_fully_replicated());
  EXPECT_EQ(single.shard_shape({5, 7}), (Shape{5, 7}));
  EXPECT_EQ(single.devices_indices_map({5, 7})[0].first.local_index(), 3);
  EXPECT_EQ(single.platform(), default_platform());
  EXPECT_EQ(NamedSharding(mesh, P("x")).str(),
            "NamedSharding(mesh=Mesh('x': 4, 'y': 2), spec=P('x',))");
  Sharding base = NamedSharding(mesh, P("y"));  // converts to the value type
  EXPECT_EQ(base.shard_shape({8, 4}), (Shape{4, 4}));
}

// Whether Arrays of two shardings may meet in one op without device_put.
TEST(Sharding, SameDomainAndSameMesh) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  Mesh same = make_mesh({4, 2}, {"x", "y"});
  Mesh other = make_mesh({8}, {"x"});
  const NamedSharding a(mesh, P("x")), b(same, P(None, "y")), c(other, P("x"));
  const SingleDeviceSharding d0(devices()[0]), d0b(devices()[0]), d1(devices()[1]);
  EXPECT_TRUE(a.same_domain(b));  // equal meshes, other specs
  EXPECT_TRUE(a.same_mesh(b));
  EXPECT_FALSE(a.same_domain(c));
  EXPECT_FALSE(a.same_mesh(c));
  EXPECT_TRUE(d0.same_domain(d0b));  // one device
  EXPECT_FALSE(d0.same_mesh(d0b));   // no mesh at all
  EXPECT_FALSE(d0.same_domain(d1));
  EXPECT_FALSE(a.same_domain(d0));
  EXPECT_FALSE(d0.same_domain(a));
}

// as_named(): isinstance(s, NamedSharding) and the cast; the view shares the sharding's state.
TEST(Sharding, AsNamed) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  const Sharding named = NamedSharding(mesh, P("x", None));  // through the value type
  const Sharding single = SingleDeviceSharding(devices()[1]);
  std::optional<NamedSharding> n = named.as_named();
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->mesh(), mesh);
  EXPECT_EQ(n->spec(), P("x", None));
  EXPECT_EQ(&n->spec(), &named.spec_or_empty());  // shared, not copied
  EXPECT_TRUE(*n == named);
  EXPECT_FALSE(single.as_named().has_value());
  EXPECT_EQ(single.spec_or_empty(), P());
}

TEST(ShardingErrors, UnknownAxis) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  EXPECT_MESHRT_ERROR(NamedSharding(mesh, P("z")), "[sharding]",
                      "Resource axis: z of P('z',) is not found in mesh: ('x', 'y').");
}

TEST(ShardingErrors, AxisUsedTwice) {
  Mesh mesh = make_mesh({2, 2, 2}, {"x", "y", "z"});
  EXPECT_MESHRT_ERROR(NamedSharding(mesh, P("x", "x")), "[sharding]",
                      "P('x', 'x') has duplicate entries for `x`");
  EXPECT_MESHRT_ERROR(NamedSharding(mesh, P(Axes{"y", "x"}, Axes{"x", "y"}, "z")),
                      "duplicate entries for `x`, `y`");
}

TEST(ShardingErrors, IndivisibleAndTooLong) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  EXPECT_MESHRT_ERROR(NamedSharding(mesh, P(Axes{"x", "y"})).shard_shape({12}),
                      "array axis 0 is partitioned 8 times, but the dimension size is 12",
                      "per-dimension tiling factors: (8,)");
  EXPECT_MESHRT_ERROR(
      NamedSharding(mesh, P("x", None)).shard_shape({8}),
      "only valid for values of rank at least 2, but was applied to a value of rank 1");
  EXPECT_MESHRT_ERROR(NamedSharding(mesh, P("x")).shard_shape({}),
                      "For scalars the PartitionSpec should be P()");
  EXPECT_MESHRT_ERROR(NamedSharding(mesh, P("x")).shard_shape({-4}), "negative dimension");
}

TEST(Mesh, ShapeNamesDevices) {
  Mesh mesh = make_mesh({4, 2}, {"data", "model"});
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_EQ(mesh.axis_size("data"), 4);
  EXPECT_EQ(mesh.axis_size("model"), 2);
  EXPECT_EQ(mesh.str(), "Mesh('data': 4, 'model': 2)");
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(mesh.devices()[k].local_index(), k);
    EXPECT_EQ(mesh.coords(k), (std::vector<int64_t>{k / 2, k % 2}));
  }
  auto devs = devices();
  Mesh custom({devs[7], devs[6], devs[5], devs[4]}, {2, 2}, {"a", "b"});
  EXPECT_EQ(custom.position_of(devs[5]), 2);
  EXPECT_EQ(custom.position_of(devs[0]), -1);
  auto m = NamedSharding(custom, P("a")).devices_indices_map({4});
  EXPECT_EQ(m[0].first, devs[7]);
  EXPECT_EQ(m[2].second, (Index{{2, 4}}));
  EXPECT_EQ(custom, Mesh({devs[7], devs[6], devs[5], devs[4]}, {2, 2}, {"a", "b"}));
  EXPECT_FALSE(custom == make_mesh({2, 2}, {"a", "b"}));
}

TEST(MeshErrors, BadMeshes) {
  auto devs = devices();
  EXPECT_MESHRT_ERROR(Mesh({devs[0], devs[1], devs[2]}, {2, 2}, {"x", "y"}), "[mesh]",
                      "needs 4 devices but 3 were given");
  EXPECT_MESHRT_ERROR(Mesh({devs[0], devs[1]}, {2}, {"x", "y"}), "[mesh]",
                      "1 axes but 2 axis names");
  EXPECT_MESHRT_ERROR(Mesh({devs[0], devs[1], devs[2], devs[3]}, {2, 2}, {"x", "x"}),
                      "duplicate axis name 'x'");
  EXPECT_MESHRT_ERROR(
      Mesh({devs[0], devs[0]}, {2}, {"x"}),
      std::string("device ") + test::dev_name(0) + std::string(" appears more than once"));
  EXPECT_MESHRT_ERROR(Mesh({}, {0}, {"x"}), "size 0");
  EXPECT_MESHRT_ERROR(
      make_mesh({4, 4}, {"x", "y"}), "[mesh]",
      "Number of devices 8 must be >= the product of mesh_shape (4, 4)",
      default_platform() == "cpu" ? "MESHRT_CPU_DEVICES=16" : "MESHRT_CUDA_DEVICES_PER_GPU");
  EXPECT_MESHRT_ERROR(make_mesh({2, 2}, {"x"}), "[mesh]");
  // A zero axis is named before the device count (it would read as needing 16 devices: too many
  // for 8, though the shape needs none).
  EXPECT_MESHRT_ERROR(make_mesh({0, 16}, {"x", "y"}), "[mesh] make_mesh: mesh axis 'x' has size 0",
                      "every mesh axis needs size >= 1");
  EXPECT_MESHRT_ERROR(make_mesh({16, -1}, {"x", "y"}, devs),
                      "make_mesh: mesh axis 'y' has size -1");
  EXPECT_MESHRT_ERROR(create_device_mesh({4, 0}),
                      "[mesh] create_device_mesh: axis 1 of mesh shape (4, 0) has size 0");
  EXPECT_MESHRT_ERROR(make_mesh({int64_t{1} << 32, int64_t{1} << 32}, {"x", "y"}),
                      "more devices than fit in 64 bits");
  EXPECT_MESHRT_ERROR(make_mesh({8}, {"x"}).axis_size("q"),
                      "axis 'q' is not in the mesh axes ('x',)");
}

}  // namespace
}  // namespace meshrt
