// Trees (runtime/tree.h, runtime/tree_shard_map.h): every container kind, registered structs
// and class templates, static fields, paths in errors, device_put/filter_shard of trees, and
// tree_shard_map against the flat shard_map. Values are checked against host arithmetic.
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/detail/access.h"
#include "runtime/tree_shard_map.h"
#include "tests/test_util.h"

namespace app {
using meshrt::Array;
using meshrt::Sharding;

struct Params {
  Array w1, w2;
  std::vector<Array> biases;
  int layers = 2;
  std::string activation = "relu";
};
MESHRT_TREE(Params, w1, w2, biases, layers, activation);

// A parallel struct of shardings: paired with Params by field name (statics need no pair).
struct ParamsShardings {
  Sharding w1, w2;
  std::vector<Sharding> biases;
};
MESHRT_TREE(ParamsShardings, w1, w2, biases);

struct MissingBiases {
  Sharding w2, w1;  // other order: fields pair by name
};
MESHRT_TREE(MissingBiases, w2, w1);

struct Model {
  Params encoder;
  std::map<std::string, Array> heads;
  std::tuple<Array, std::pair<Array, int>> misc;
  std::array<Array, 2> pair_of;
  double scale = 0.5;
};
MESHRT_TREE(Model, encoder, heads, misc, pair_of, scale);

template <class A>
struct Layer {
  A w, b;
  int width = 0;
};
MESHRT_TREE_TEMPLATE(Layer, w, b, width);

}  // namespace app

namespace meshrt {
namespace {

using app::Layer;
using app::Model;
using app::Params;
using test::host_values;

// The overloads of runtime/array.h are untouched by the tree overloads.
static_assert(std::is_same_v<decltype(device_put(std::declval<const Array&>(),
                                                 std::declval<const Sharding&>())),
                             Array>);
static_assert(!BranchTree<Array> && !BranchTree<Tensor> && !BranchTree<std::vector<float>>);
static_assert(BranchTree<Params> && BranchTree<std::vector<Array>> && BranchTree<Layer<Tensor>>);

class TreeTest : public ::testing::Test {
 protected:
  Mesh mesh = make_mesh({4, 2}, {"data", "model"});
  Sharding rep = NamedSharding(mesh, P());

  // An 8x4 f32 Array with values base, base+1, ... on `s`.
  Array iota(float base, const Sharding& s, Shape shape = {8, 4}) const {
    std::vector<float> v(static_cast<size_t>(shape_size(shape)));
    std::iota(v.begin(), v.end(), base);
    return device_put(v, shape, s);
  }
  static std::vector<double> iota_host(double base, size_t n = 32, double scale = 1.0) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = scale * (base + static_cast<double>(i));
    return v;
  }
  Params params() const {
    return Params{
        iota(0, rep), iota(100, rep), {iota(200, rep), iota(300, rep), iota(400, rep)}, 3, "gelu"};
  }
};

TEST_F(TreeTest, TreeMapEveryContainerKind) {
  auto twice = [](const Array& a) { return 2.0 * a; };
  std::vector<Array> v = tree_map(twice, std::vector<Array>{iota(0, rep), iota(10, rep)});
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(host_values(v[1]), iota_host(10, 32, 2.0));

  std::array<Array, 2> a = tree_map(twice, std::array<Array, 2>{iota(0, rep), iota(5, rep)});
  EXPECT_EQ(host_values(a[1]), iota_host(5, 32, 2.0));

  auto t = tree_map(twice, std::tuple<Array, int, Array>{iota(1, rep), 7, iota(2, rep)});
  static_assert(std::is_same_v<decltype(t), std::tuple<Array, int, Array>>);
  EXPECT_EQ(std::get<1>(t), 7);  // static: copied
  EXPECT_EQ(host_values(std::get<2>(t)), iota_host(2, 32, 2.0));

  auto p = tree_map(twice, std::pair<Array, std::string>{iota(3, rep), "name"});
  static_assert(std::is_same_v<decltype(p), std::pair<Array, std::string>>);
  EXPECT_EQ(p.second, "name");
  EXPECT_EQ(host_values(p.first), iota_host(3, 32, 2.0));

  std::map<std::string, Array> m =
      tree_map(twice, std::map<std::string, Array>{{"b", iota(4, rep)}, {"a", iota(6, rep)}});
  EXPECT_EQ(host_values(m.at("a")), iota_host(6, 32, 2.0));
  EXPECT_EQ(host_values(m.at("b")), iota_host(4, 32, 2.0));
}

TEST_F(TreeTest, TreeMapStructsKeepStaticFields) {
  Model model{params(),
              {{"cls", iota(1000, rep)}},
              {iota(2000, rep), {iota(3000, rep), 9}},
              {iota(4000, rep), iota(5000, rep)},
              0.25};
  Model out = tree_map([](const Array& x) { return x + 1.0; }, model);
  EXPECT_EQ(out.encoder.layers, 3);
  EXPECT_EQ(out.encoder.activation, "gelu");
  EXPECT_EQ(out.scale, 0.25);
  EXPECT_EQ(std::get<1>(std::get<1>(out.misc)), 9);
  EXPECT_EQ(host_values(out.encoder.biases[2]), iota_host(401));
  EXPECT_EQ(host_values(out.heads.at("cls")), iota_host(1001));
  EXPECT_EQ(host_values(std::get<0>(std::get<1>(out.misc))), iota_host(3001));
  EXPECT_EQ(host_values(out.pair_of[1]), iota_host(5001));
  // The input is untouched.
  EXPECT_EQ(host_values(model.encoder.biases[2]), iota_host(400));
}

TEST_F(TreeTest, TreeMapOverSeveralTreesAndLeafTypes) {
  Params a = params(), b = params();
  Params sum = tree_map([](const Array& x, const Array& y) { return x + y; }, a, b);
  EXPECT_EQ(host_values(sum.w2), iota_host(100, 32, 2.0));
  // Leaf type changes: containers are rebuilt; a class template is re-instantiated.
  std::vector<Tensor> blocks =
      tree_map([](const Array& x) { return detail::ArrayAccess::blocks(x)[0]; },
               std::vector<Array>{a.w1, a.w2});
  EXPECT_EQ(host_values(blocks[1]), iota_host(100));
  Layer<Array> layer{a.w1, a.w2, 16};
  Layer<Tensor> local =
      tree_map([](const Array& x) { return detail::ArrayAccess::blocks(x)[3]; }, layer);
  EXPECT_EQ(local.width, 16);
  EXPECT_EQ(local.w.device(), mesh.devices()[3]);
  EXPECT_EQ(host_values(local.b), iota_host(100));
  // The other trees' leaves may be anything: here PartitionSpecs and ints.
  auto described = tree_map([](const Array& x, const PartitionSpec& s,
                               int k) { return detail::ArrayAccess::blocks(x)[k].str() + s.str(); },
                            std::vector<Array>{a.w1}, std::vector<PartitionSpec>{P("data")},
                            std::vector<int>{2});
  static_assert(std::is_same_v<decltype(described), std::vector<std::string>>);
  EXPECT_NE(described[0].find("P('data',)"), std::string::npos);
}

TEST_F(TreeTest, LeavesAndPathsInVisitOrder) {
  Model model{params(),
              {{"z", iota(1, rep)}, {"a", iota(2, rep)}},
              {iota(3, rep), {iota(4, rep), 1}},
              {iota(5, rep), iota(6, rep)},
              1.0};
  std::vector<std::string> paths;
  tree_map_with_path(
      [&paths](const std::string& path, const Array& x) {
        paths.push_back(path);
        return x;
      },
      model);
  const std::vector<std::string> expected = {
      "tree.encoder.w1",        "tree.encoder.w2",        "tree.encoder.biases[0]",
      "tree.encoder.biases[1]", "tree.encoder.biases[2]", "tree.heads['a']",
      "tree.heads['z']",        "tree.misc[0]",           "tree.misc[1][0]",
      "tree.pair_of[0]",        "tree.pair_of[1]"};
  EXPECT_EQ(paths, expected);
  std::vector<std::string> visited;
  tree_visit(model, [&](const Array&, const std::string& path) { visited.push_back(path); });
  EXPECT_EQ(visited, expected);

  std::vector<Array> leaves = tree_leaves(model);
  ASSERT_EQ(leaves.size(), expected.size());
  EXPECT_EQ(tree_num_leaves(model), expected.size());
  EXPECT_EQ(host_values(leaves[5]), iota_host(2));  // heads['a']: keys in order
  EXPECT_EQ(host_values(leaves[8]), iota_host(4));
  // tree_unflatten is tree_leaves' inverse; it keeps static fields and may change leaf type.
  std::vector<Array> reversed(leaves.rbegin(), leaves.rend());
  Model back = tree_unflatten(model, reversed);
  EXPECT_EQ(host_values(back.encoder.w1), iota_host(6));
  EXPECT_EQ(host_values(back.pair_of[1]), iota_host(0));
  EXPECT_EQ(back.encoder.activation, "gelu");
  Layer<Tensor> lt = tree_unflatten(Layer<Array>{leaves[0], leaves[1], 5},
                                    std::vector<Tensor>{detail::ArrayAccess::blocks(leaves[2])[0],
                                                        detail::ArrayAccess::blocks(leaves[3])[0]});
  EXPECT_EQ(lt.width, 5);
  EXPECT_EQ(host_values(lt.b), iota_host(300));
  EXPECT_MESHRT_ERROR(tree_unflatten(model, std::vector<Array>{leaves[0]}),
                      "[tree] tree_unflatten: the tree has 11 leaves but 1 were given");
  std::vector<Tensor> tensors = tree_leaves<Tensor>(Layer<Tensor>{
      detail::ArrayAccess::blocks(leaves[0])[0], detail::ArrayAccess::blocks(leaves[1])[1]});
  EXPECT_EQ(tensors.size(), 2u);
}

TEST_F(TreeTest, StructureMismatchesNameThePath) {
  Params a = params(), b = params();
  b.biases.pop_back();
  auto add = [](const Array& x, const Array& y) { return x + y; };
  EXPECT_MESHRT_ERROR(tree_map(add, a, b), "[tree] tree_map: structure mismatch at tree.biases:",
                      "a std::vector of 3 in the first tree",
                      "a std::vector of 2 in the second tree");
  EXPECT_FALSE(tree_structure_equal(a, b));
  EXPECT_TRUE(tree_structure_equal(a, params()));
  EXPECT_MESHRT_ERROR(check_tree_structure(a, b, "my_api"),
                      "[tree] my_api: structure mismatch at tree.biases");

  std::map<std::string, Array> m1{{"a", a.w1}, {"b", a.w2}}, m2{{"a", a.w1}, {"c", a.w2}};
  EXPECT_MESHRT_ERROR(tree_map(add, m1, m2), "structure mismatch at tree:",
                      "a std::map with keys 'a', 'b' in the first tree",
                      "a std::map with keys 'a', 'c' in the second tree");
  // Different kinds: a vector where the first tree has a leaf, a map where it has a vector.
  std::vector<std::vector<Array>> nested{{a.w1}, {a.w2}};
  std::vector<std::vector<Array>> nested_ok{{a.w1}, {a.w2}};
  EXPECT_NO_THROW(tree_map(add, nested, nested_ok));
  EXPECT_MESHRT_ERROR(tree_map(add, std::vector<Array>{a.w1, a.w2}, nested),
                      "structure mismatch at tree[0]:", "an Array in the first tree",
                      "a std::vector of 1 in the second tree");
  EXPECT_MESHRT_ERROR(
      tree_map(add, std::vector<Array>{a.w1}, std::map<std::string, Array>{{"x", a.w1}}),
      "structure mismatch at tree:", "a std::vector of 1 in the first tree",
      "a std::map with keys 'x' in the second tree");
  // Deep paths.
  Model m{params(), {}, {a.w1, {a.w2, 0}}, {a.w1, a.w2}, 1.0};
  Model n = m;
  n.encoder.biases.resize(1);
  EXPECT_MESHRT_ERROR(tree_map(add, m, n), "structure mismatch at tree.encoder.biases:");
  n = m;
  n.heads["x"] = a.w1;
  EXPECT_MESHRT_ERROR(tree_map(add, m, n), "structure mismatch at tree.heads:");
  // A tree_leaves of the wrong leaf type names the leaf.
  Layer<Tensor> local{detail::ArrayAccess::blocks(a.w1)[0], detail::ArrayAccess::blocks(a.w2)[0]};
  EXPECT_MESHRT_ERROR(tree_leaves(local),
                      "[tree] tree_leaves: tree.w is a Tensor; tree_leaves<Array> collects Arrays");
}

TEST_F(TreeTest, DevicePutTreeOnOneSharding) {
  Params p = params();
  NamedSharding rows(mesh, P("data", "model"));
  Params q = device_put(p, rows);
  EXPECT_EQ(q.layers, 3);
  EXPECT_EQ(q.activation, "gelu");
  tree_visit(q, [&](const Array& x, const std::string& path) {
    EXPECT_EQ(x.sharding(), Sharding(rows)) << path;
  });
  EXPECT_EQ(host_values(q.biases[1]), iota_host(300));
  // Containers and a Tensor leaf (which becomes an Array).
  auto t = device_put(std::tuple<Array, Tensor>{p.w1, detail::ArrayAccess::blocks(p.w2)[0]}, rows);
  static_assert(std::is_same_v<decltype(t), std::tuple<Array, Array>>);
  EXPECT_EQ(std::get<1>(t).sharding(), Sharding(rows));
  EXPECT_EQ(host_values(std::get<1>(t)), iota_host(100));
}

TEST_F(TreeTest, DevicePutTreeOfShardings) {
  Params p = params();
  NamedSharding rows(mesh, P("data")), cols(mesh, P(None, "model")), both(mesh, P("data", "model"));
  app::ParamsShardings s{rows, cols, {rep, both, rows}};
  Params q = device_put(p, s);
  EXPECT_EQ(q.w1.sharding(), Sharding(rows));
  EXPECT_EQ(q.w2.sharding(), Sharding(cols));
  EXPECT_EQ(q.biases[0].sharding(), rep);
  EXPECT_EQ(q.biases[1].sharding(), Sharding(both));
  EXPECT_EQ(q.biases[2].sharding(), Sharding(rows));
  EXPECT_EQ(host_values(q.w2), iota_host(100));
  EXPECT_EQ(q.activation, "gelu");

  // A map of shardings for a map; a prefix: one Sharding for a whole subtree.
  std::map<std::string, Array> m{{"a", p.w1}, {"b", p.w2}};
  auto mq = device_put(m, std::map<std::string, Sharding>{{"a", rows}, {"b", cols}});
  EXPECT_EQ(mq.at("b").sharding(), Sharding(cols));
  auto nested = device_put(std::pair<std::vector<Array>, Array>{{p.w1, p.w2}, p.biases[0]},
                           std::pair<Sharding, Sharding>{rows, cols});
  EXPECT_EQ(nested.first[1].sharding(), Sharding(rows));
  EXPECT_EQ(nested.second.sharding(), Sharding(cols));

  // A function of the path.
  Params f = device_put(p, [&](const std::string& path, const Array&) -> Sharding {
    return path.find("biases") != std::string::npos ? Sharding(rows) : Sharding(cols);
  });
  EXPECT_EQ(f.w1.sharding(), Sharding(cols));
  EXPECT_EQ(f.biases[2].sharding(), Sharding(rows));
  EXPECT_EQ(host_values(f.biases[2]), iota_host(400));
}

TEST_F(TreeTest, DevicePutErrorsNameThePath) {
  Params p = params();
  NamedSharding rows(mesh, P("data"));
  app::ParamsShardings short_biases{rows, rows, {rows, rows}};
  EXPECT_MESHRT_ERROR(device_put(p, short_biases),
                      "[tree] device_put: structure mismatch at tree.biases:",
                      "a std::vector of 3 in the tree", "a std::vector of 2 in the shardings");
  EXPECT_MESHRT_ERROR(device_put(p, app::MissingBiases{rows, rows}),
                      "[tree] device_put: structure mismatch at tree.biases:",
                      "the shardings (app::MissingBiases) has no field 'biases'");
  // A spec that does not divide the shape: device_put's own error, with the path.
  Params odd = p;
  odd.biases[1] = iota(0, rep, {6, 4});
  EXPECT_MESHRT_ERROR(device_put(odd, NamedSharding(mesh, P("data"))),
                      "[tree] device_put: at tree.biases[1]: ");
  // A leaf never set.
  Params unset = p;
  unset.biases[2] = Array();
  EXPECT_MESHRT_ERROR(filter_shard(unset, rep),
                      "[tree] filter_shard: tree.biases[2] is an empty Array");
  // Shardings leaves that are not shardings.
  EXPECT_MESHRT_ERROR(device_put(std::vector<Array>{p.w1}, std::vector<PartitionSpec>{P("data")}),
                      "[tree] device_put: the shardings hold a PartitionSpec at tree[0]");
  // The function form takes Arrays: a Tensor leaf is named.
  EXPECT_MESHRT_ERROR(
      device_put(std::vector<Tensor>{detail::ArrayAccess::blocks(p.w1)[0]},
                 [&](const std::string&, const Array&) -> Sharding { return rows; }),
      "[tree] device_put: tree[0] is a Tensor; the shardings function takes");
}

TEST_F(TreeTest, FilterShard) {
  Params p = params();
  NamedSharding rows(mesh, P("data"));
  Params q = filter_shard(p, rows);
  EXPECT_EQ(q.biases[0].sharding(), Sharding(rows));
  EXPECT_EQ(q.layers, 3);
  EXPECT_EQ(q.activation, "gelu");
  // A Device: every leaf moves to that one device (cpu -> cpu here; cpu -> cuda the same way).
  Device d = devices()[5];
  Params on5 = filter_shard(q, d);
  tree_visit(on5, [&](const Array& x, const std::string& path) {
    EXPECT_EQ(x.sharding(), Sharding(SingleDeviceSharding(d))) << path;
    EXPECT_EQ(x.device(), d) << path;
  });
  EXPECT_EQ(host_values(on5.w2), iota_host(100));
  EXPECT_EQ(host_values(on5.biases[2]), iota_host(400));
  EXPECT_EQ(on5.activation, "gelu");
  // One leaf, and a tree of shardings with a prefix.
  Array one = filter_shard(p.w1, d);
  EXPECT_EQ(one.device(), d);
  Model m{p, {{"h", p.w1}}, {p.w1, {p.w2, 4}}, {p.w1, p.w2}, 2.0};
  Model placed = filter_shard(m, rows);
  EXPECT_EQ(std::get<1>(std::get<1>(placed.misc)), 4);
  EXPECT_EQ(placed.scale, 2.0);
  EXPECT_EQ(placed.heads.at("h").sharding(), Sharding(rows));
}

// The tree form of shard_map gives what the flat form gives, for every container kind.
TEST_F(TreeTest, TreeShardMapMatchesFlatShardMap) {
  NamedSharding rows(mesh, P("data"));
  Array x = iota(0, rows);
  Array w = iota(1, rep, {4, 4});
  Array b = iota(2, rep, {2, 4});
  auto flat = shard_map(
      [](Context& ctx, const Tensor& x, const Tensor& w, const Tensor& b) {
        return std::vector<Tensor>{matmul(x, w) + b, ctx.psum(x, "data")};
      },
      mesh, {P("data"), P(), P()}, {P("data"), P()});
  std::vector<Array> ref = flat(x, w, b);
  const std::vector<double> y_ref = host_values(ref[0]), s_ref = host_values(ref[1]);

  // A class template: Layer<Array> in, Layer<Tensor> in the body, Layer<Array> out.
  auto layer_body = [](Context& ctx, const Tensor& x, const Layer<Tensor>& l) {
    return Layer<Tensor>{matmul(x, l.w) + l.b, ctx.psum(x, "data"), l.width + 1};
  };
  auto f =
      tree_shard_map(layer_body, mesh, std::make_tuple(P("data"), Layer<PartitionSpec>{P(), P()}),
                     Layer<PartitionSpec>{P("data"), P()});
  Layer<Array> out = f(x, Layer<Array>{w, b, 7});
  EXPECT_EQ(out.width, 8);
  EXPECT_EQ(host_values(out.w), y_ref);
  EXPECT_EQ(host_values(out.b), s_ref);
  EXPECT_EQ(out.w.sharding(), Sharding(rows));
  EXPECT_TRUE(out.b.is_fully_replicated());
  // Prefixes: P() for the whole Layer; one spec for every argument.
  auto g = tree_shard_map(layer_body, mesh, std::make_tuple(P("data"), P()),
                          Layer<PartitionSpec>{P("data"), P()});
  EXPECT_EQ(host_values(g(x, Layer<Array>{w, b, 0}).w), y_ref);

  // std::vector in and out.
  auto v = tree_shard_map(
      [](Context& ctx, const std::vector<Tensor>& xs) {
        return std::vector<Tensor>{matmul(xs[0], xs[1]) + xs[2], ctx.psum(xs[0], "data")};
      },
      mesh, std::make_tuple(std::vector{P("data"), P(), P()}), std::vector{P("data"), P()});
  std::vector<Array> vo = v(std::vector<Array>{x, w, b});
  ASSERT_EQ(vo.size(), 2u);
  EXPECT_EQ(host_values(vo[0]), y_ref);
  EXPECT_EQ(host_values(vo[1]), s_ref);

  // std::map in and out; in_specs as a std::vector with one spec tree per argument.
  auto m = tree_shard_map(
      [](Context& ctx, const std::map<std::string, Tensor>& t, const Tensor& x) {
        return std::map<std::string, Tensor>{{"y", matmul(x, t.at("w")) + t.at("b")},
                                             {"s", ctx.psum(x, "data")}};
      },
      mesh, std::make_tuple(P(), P("data")),
      std::map<std::string, PartitionSpec>{{"y", P("data")}, {"s", P()}});
  auto mo = m(std::map<std::string, Array>{{"w", w}, {"b", b}}, x);
  EXPECT_EQ(host_values(mo.at("y")), y_ref);
  EXPECT_EQ(host_values(mo.at("s")), s_ref);

  // A tuple out with one spec per element; a Tensor out; a std::vector of in_specs.
  auto t = tree_shard_map(
      [](Context& ctx, const std::tuple<Tensor, Tensor>& wb, const Tensor& x) {
        return std::tuple<Tensor, Tensor>{matmul(x, std::get<0>(wb)) + std::get<1>(wb),
                                          ctx.psum(x, "data")};
      },
      mesh, std::vector{P(), P("data")}, std::make_tuple(P("data"), P()));
  auto to = t(std::make_tuple(w, b), x);
  EXPECT_EQ(host_values(std::get<0>(to)), y_ref);
  EXPECT_EQ(host_values(std::get<1>(to)), s_ref);
  auto one = tree_shard_map([](Context& ctx, const Tensor& x) { return ctx.psum(x, "data"); }, mesh,
                            P("data"), P());
  Array so = one(x);
  EXPECT_EQ(host_values(so), s_ref);
  // One spec for a fixed-size output subtree (a std::array of two Tensors).
  auto arr = tree_shard_map(
      [](Context&, const Tensor& x) {
        return std::array<Tensor, 2>{x, x * 2.0};
      },
      mesh, P("data"), P("data"));
  std::array<Array, 2> ao = arr(x);
  EXPECT_EQ(host_values(ao[1]), iota_host(0, 32, 2.0));
}

TEST_F(TreeTest, TreeShardMapErrorsNameThePath) {
  NamedSharding rows(mesh, P("data"));
  Array x = iota(0, rows);
  auto sum_body = [](Context&, const std::vector<Tensor>& xs) {
    return std::vector<Tensor>{xs[0] + xs[1]};
  };
  auto f = tree_shard_map(sum_body, mesh, std::make_tuple(std::vector{P("data"), P("data"), P()}),
                          std::vector{P("data")});
  EXPECT_MESHRT_ERROR(f(std::vector<Array>{x, x}),
                      "[shard_map] tree_shard_map: structure mismatch at args[0]:",
                      "a std::vector of 2 in the arguments", "a std::vector of 3 in in_specs");
  auto g = tree_shard_map(sum_body, mesh, P("data"), P("data"));
  EXPECT_MESHRT_ERROR(g(std::vector<Array>{x, x}),
                      "out_specs has one PartitionSpec at out for a std::vector");
  auto h = tree_shard_map(sum_body, mesh, P("data"), std::vector{P("data"), P()});
  EXPECT_MESHRT_ERROR(h(std::vector<Array>{x, x}),
                      "structure mismatch at out:", "a std::vector of 1 in the body's result",
                      "a std::vector of 2 in out_specs");
  EXPECT_MESHRT_ERROR(g(std::vector<Tensor>{detail::ArrayAccess::blocks(x)[0]}),
                      "args[0][0] is a Tensor; shard_map takes Arrays");
  Layer<Array> unset{x, Array(), 0};
  auto l = tree_shard_map([](Context&, const Layer<Tensor>& l) { return l.w; }, mesh, P("data"),
                          P("data"));
  EXPECT_MESHRT_ERROR(l(unset), "args[0].b is an empty Array");
  // The flat shard_map's errors say which leaf a flat spec index is.
  auto bad_axis = tree_shard_map([](Context&, const Layer<Tensor>& l) { return l.w; }, mesh,
                                 std::make_tuple(Layer<PartitionSpec>{P(), P("x")}), P());
  EXPECT_MESHRT_ERROR(bad_axis(Layer<Array>{x, x, 0}), "in_specs[1] refers to mesh axis 'x'",
                      "(in_specs[1] is the spec of args[0].b)");
  // An out_specs entry: checked after the bodies ran, and, differentiated, inside each body (the
  // body's error wraps it).
  auto vary = tree_shard_map(
      [](Context&, const Tensor& v) {
        return std::array<Tensor, 2>{v, v * 2.0};
      },
      mesh, P("data"), std::array<PartitionSpec, 2>{P("data"), P()});
  EXPECT_MESHRT_ERROR(vary(x), "out_specs[1] is P() which implies",
                      "(out_specs[1] is the spec of out[1])");
  EXPECT_MESHRT_ERROR(grad([&](const Array& v) { return sum(vary(v)[0]); })(x),
                      "[shard_map] body on", "could not infer replication",
                      "(out_specs[1] is the spec of out[1])");
  // Other errors get no note, whatever their text says.
  auto says_spec = tree_shard_map(
      [](Context&, const Tensor& v) -> Tensor { throw Error("[user] in_specs[0] is wrong"); }, mesh,
      P("data"), P("data"));
  try {
    (void)says_spec(x);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("is the spec of"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshrt
