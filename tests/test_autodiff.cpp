// Autodiff: every op's rule against central finite differences in f64 (Tensors on one device,
// Arrays on several shardings), shard_map with each collective, trees, jvp, errors, and the
// backward pass's communication. The JAX-generated expectations are in test_autodiff_jax.cpp.
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace meshrt {
namespace {

using test::host_values;

std::vector<double> random_values(size_t n, uint32_t seed, bool positive) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(positive ? 0.5 : -1.0, positive ? 2.0 : 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// One op under test, written once for Tensors and Arrays.
struct OpCase {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Tensor(const std::vector<Tensor>&)> tensor_fn;
  std::function<Array(const std::vector<Array>&)> array_fn;
  bool positive = false;
};

#define OP_CASE(name, shapes, positive, expr)                                  \
  OpCase {                                                                     \
    name, shapes, [](const std::vector<Tensor>& v) -> Tensor { return expr; }, \
        [](const std::vector<Array>& v) -> Array { return expr; }, positive    \
  }

std::vector<OpCase> op_cases() {
  using S = std::vector<Shape>;
  return {
      OP_CASE("add_broadcast", (S{{4, 8}, {8}}), false, add(v[0], v[1])),
      OP_CASE("subtract", (S{{4, 8}, {4, 1}}), false, subtract(v[0], v[1])),
      OP_CASE("multiply", (S{{4, 8}, {4, 8}}), false, multiply(v[0], v[1])),
      OP_CASE("divide", (S{{4, 8}, {8}}), true, divide(v[0], v[1])),
      OP_CASE("maximum", (S{{4, 8}, {4, 8}}), false, maximum(v[0], v[1])),
      OP_CASE("minimum", (S{{4, 8}, {1, 8}}), false, minimum(v[0], v[1])),
      OP_CASE("where", (S{{4, 8}, {4, 8}}), false, where(greater(v[0], 0.0), v[0], v[1])),
      OP_CASE("neg", (S{{4, 8}}), false, neg(v[0])),
      OP_CASE("exp", (S{{4, 8}}), false, exp(v[0])),
      OP_CASE("log", (S{{4, 8}}), true, log(v[0])),
      OP_CASE("sin", (S{{4, 8}}), false, sin(v[0])),
      OP_CASE("cos", (S{{4, 8}}), false, cos(v[0])),
      OP_CASE("tanh", (S{{4, 8}}), false, tanh(v[0])),
      OP_CASE("sqrt", (S{{4, 8}}), true, sqrt(v[0])),
      OP_CASE("relu", (S{{4, 8}}), false, relu(v[0])),
      OP_CASE(
          "scalars", (S{{4, 8}}), true,
          2.0 - (3.0 * v[0] + 1.0) / 2.0 - 1.5 / v[0] + maximum(v[0], 1.0) + minimum(v[0], 1.2)),
      OP_CASE("sum_all", (S{{4, 8}}), false, sum(v[0])),
      OP_CASE("sum_0", (S{{4, 8}}), false, sum(v[0], 0)),
      OP_CASE("sum_1_keepdims", (S{{4, 8}}), false, sum(v[0], 1, true)),
      OP_CASE("mean_0", (S{{4, 8}}), false, mean(v[0], 0)),
      OP_CASE("mean_all", (S{{4, 8}}), false, mean(v[0])),
      OP_CASE("max_1", (S{{4, 8}}), false, max(v[0], 1)),
      OP_CASE("min_0_keepdims", (S{{4, 8}}), false, min(v[0], 0, true)),
      OP_CASE("max_all", (S{{4, 8}}), false, max(v[0])),
      OP_CASE("softmax", (S{{4, 8}}), false, softmax(v[0])),
      OP_CASE("softmax_0", (S{{4, 8}}), false, softmax(v[0], 0)),
      OP_CASE("log_softmax", (S{{4, 8}}), false, log_softmax(v[0])),
      OP_CASE("matmul", (S{{4, 8}, {8, 8}}), false, matmul(v[0], v[1])),
      OP_CASE("matmul_vec", (S{{8}, {8, 8}}), false, matmul(v[0], v[1])),
      OP_CASE("matmul_batched", (S{{2, 4, 8}, {8, 8}}), false, matmul(v[0], v[1])),
      OP_CASE("dot_mat_vec", (S{{4, 8}, {8}}), false, dot(v[0], v[1])),
      OP_CASE("matmul_transposed_a", (S{{8, 4}, {8, 8}}), false,
              matmul_transposed(v[0], v[1], true, false)),
      OP_CASE("matmul_transposed_b", (S{{4, 8}, {6, 8}}), false,
              matmul_transposed(v[0], v[1], false, true)),
      OP_CASE("matmul_transposed_both", (S{{8, 4}, {6, 8}}), false,
              matmul_transposed(v[0], v[1], true, true)),
      OP_CASE("matmul_transposed_batched", (S{{2, 8, 4}, {8, 8}}), false,
              matmul_transposed(v[0], v[1], true, false)),
      OP_CASE("matmul_transposed_vec", (S{{8}, {6, 8}}), false,
              matmul_transposed(v[0], v[1], false, true)),
      OP_CASE("transpose", (S{{4, 8}}), false, transpose(v[0]) * transpose(v[0])),
      OP_CASE("transpose_3d", (S{{2, 4, 8}}), false, sin(transpose(v[0], {1, 2, 0}))),
      OP_CASE("reshape", (S{{4, 8}}), false, sin(reshape(v[0], {8, 4}))),
      OP_CASE("slice", (S{{8, 8}}), false, sin(slice(v[0], {1, 0}, {7, 8}, {2, 3}))),
      OP_CASE("slice_in_dim", (S{{8, 8}}), false, sin(slice_in_dim(v[0], 2, 6, 1, 1))),
      OP_CASE("dynamic_slice", (S{{8, 8}}), false, sin(dynamic_slice_in_dim(v[0], 6, 4, 0))),
      OP_CASE("concatenate", (S{{4, 8}, {4, 8}}), false, sin(concatenate({v[0], v[1]}, 0))),
      OP_CASE("split", (S{{8, 8}}), false, split(v[0], 2, 0)[1] * split(v[0], 2, 0)[0]),
      OP_CASE("stack", (S{{4, 8}, {4, 8}}), false, sin(stack({v[0], v[1]}, 1))),
      OP_CASE("squeeze_expand", (S{{4, 1, 8}}), false, sin(expand_dims(squeeze(v[0]), 0))),
      OP_CASE("pad", (S{{4, 8}}), false, sin(pad(v[0], {{1, 2}, {0, 3}}, 0.5))),
      OP_CASE("astype_same", (S{{4, 8}}), false, astype(v[0], DType::f64) * v[0]),
      OP_CASE("row", (S{{8, 8}}), false, sin(v[0][3]) * v[0][-1]),
      OP_CASE("mlp_like", (S{{8, 8}, {8, 8}, {8}}), false,
              log_softmax(matmul(relu(matmul(v[0], v[1]) + v[2]), v[1]))),
  };
}

// L(inputs) = sum(f(inputs) * W) for a fixed random W: every output element matters.
template <class X, class Fn, class Make>
double loss_value(const Fn& f, const std::vector<X>& xs, const Make& weights) {
  X y = f(xs);
  return host_values(sum(y * weights(y.shape())))[0];
}

// Central differences of L at every input element, against value_and_grad.
template <class X, class Fn, class MakeInput, class MakeWeights>
void check_against_fd(const std::string& name, const Fn& f, const std::vector<Shape>& shapes,
                      bool positive, const MakeInput& make, const MakeWeights& weights) {
  std::vector<std::vector<double>> values;
  std::vector<X> xs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    values.push_back(random_values(static_cast<size_t>(shape_size(shapes[i])),
                                   static_cast<uint32_t>(17 + 31 * i), positive));
    xs.push_back(make(values.back(), shapes[i], i));
  }
  auto loss = [&](const std::vector<X>& v) { return sum(f(v) * weights(f(v).shape())); };
  auto [l, grads] = value_and_grad(loss)(xs);
  ASSERT_EQ(grads.size(), xs.size());
  EXPECT_NEAR(host_values(l)[0], loss_value<X>(f, xs, weights), 1e-12) << name;
  const double h = 1e-6;
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(grads[i].shape(), xs[i].shape()) << name;
    EXPECT_EQ(grads[i].dtype(), xs[i].dtype()) << name;
    if constexpr (std::is_same_v<X, Array>) {
      EXPECT_TRUE(grads[i].sharding() == xs[i].sharding())
          << name << ": gradient " << grads[i].sharding().str() << " vs primal "
          << xs[i].sharding().str();
    }
    const std::vector<double> g = host_values(grads[i]);
    for (size_t e = 0; e < values[i].size(); ++e) {
      std::vector<X> plus = xs, minus = xs;
      std::vector<double> vp = values[i], vm = values[i];
      vp[e] += h;
      vm[e] -= h;
      plus[i] = make(vp, shapes[i], i);
      minus[i] = make(vm, shapes[i], i);
      const double fd =
          (loss_value<X>(f, plus, weights) - loss_value<X>(f, minus, weights)) / (2 * h);
      ASSERT_NEAR(g[e], fd, 1e-6 * std::max(1.0, std::abs(fd)))
          << name << ": input " << i << " element " << e;
    }
  }
}

TEST(AutodiffFd, EveryTensorOp) {
  const Device d = devices()[0];
  for (const OpCase& c : op_cases()) {
    auto make = [&](const std::vector<double>& v, const Shape& s, size_t) {
      return tensor(v, s, d);
    };
    auto weights = [&](const Shape& s) {
      return tensor(random_values(static_cast<size_t>(shape_size(s)), 99, false), s, d);
    };
    check_against_fd<Tensor>(c.name, c.tensor_fn, c.shapes, c.positive, make, weights);
  }
}

TEST(AutodiffFd, EveryArrayOpOnShardings) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  const std::vector<PartitionSpec> specs = {P(), P("x"), P(None, "y"), P("x", "y"), P(None, "x")};
  for (const OpCase& c : op_cases()) {
    for (const PartitionSpec& spec : specs) {
      auto sharding_for = [&](const Shape& s) -> Sharding {
        // The spec where it divides the shape, else replicated.
        for (size_t dim = 0; dim < spec.size(); ++dim) {
          if (dim >= s.size()) return NamedSharding(mesh, P());
          int64_t parts = 1;
          for (const std::string& a : spec[dim]) parts *= mesh.axis_size(a);
          if (s[dim] % parts != 0) return NamedSharding(mesh, P());
        }
        return NamedSharding(mesh, spec);
      };
      auto make = [&](const std::vector<double>& v, const Shape& s, size_t) {
        return device_put(v, s, sharding_for(s));
      };
      auto weights = [&](const Shape& s) {
        return device_put(random_values(static_cast<size_t>(shape_size(s)), 99, false), s,
                          NamedSharding(mesh, P()));
      };
      check_against_fd<Array>(c.name + " " + spec.str(), c.array_fn, c.shapes, c.positive, make,
                              weights);
    }
  }
}

// matmul_transposed reads an operand transposed: the same values as an explicit transpose, on
// one device and on every sharding of the operands (the placement rule sees the swapped operand).
TEST(Autodiff, MatmulTransposedEqualsAnExplicitTranspose) {
  auto close = [](const std::vector<double>& a, const std::vector<double>& b,
                  const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-9) << what << " " << i;
  };
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  const std::vector<PartitionSpec> specs = {P(), P("x"), P(None, "y"), P("x", "y"), P("y", "x")};
  const Shape sa{8, 4}, sb{4, 8};  // a read as (4, 8), b read as (8, 4)
  const std::vector<double> va = random_values(32, 3, false), vb = random_values(32, 4, false);
  const Device d = devices()[0];
  close(host_values(matmul_transposed(tensor(va, sa, d), tensor(vb, sb, d), true, true)),
        host_values(matmul(transpose(tensor(va, sa, d)), transpose(tensor(vb, sb, d)))), "tensor");
  for (const PartitionSpec& pa : specs) {
    for (const PartitionSpec& pb : specs) {
      Array a = device_put(va, sa, NamedSharding(mesh, pa));
      Array b = device_put(vb, sb, NamedSharding(mesh, pb));
      const std::string what = pa.str() + " " + pb.str();
      close(host_values(matmul_transposed(a, b, true, true)),
            host_values(matmul(transpose(a), transpose(b))), what);
      close(host_values(matmul_transposed(a, transpose(b), true, false)),
            host_values(matmul(transpose(a), transpose(b))), what);
    }
  }
  EXPECT_MESHRT_ERROR(matmul_transposed(tensor(va, {32}, d), tensor(vb, sb, d), true, false),
                      "[ops] matmul_transposed", "at least 2-D");
  EXPECT_MESHRT_ERROR(matmul_transposed(tensor(va, sa, d), tensor(vb, sb, d), false, true),
                      "[ops] matmul_transposed", "(read transposed) do not align",
                      "last dimension (size 4)", "second-to-last dimension (size 8)");
}

TEST(Autodiff, TiesSplitAsJax) {
  const Device d = devices()[0];
  Tensor a = tensor(std::vector<double>{1, 2, 3}, {3}, d);
  Tensor b = tensor(std::vector<double>{1, 5, 0}, {3}, d);
  auto [ga, gb] =
      grad<0, 1>([](const Tensor& x, const Tensor& y) { return sum(maximum(x, y)); })(a, b);
  EXPECT_EQ(host_values(ga), (std::vector<double>{0.5, 0, 1}));
  EXPECT_EQ(host_values(gb), (std::vector<double>{0.5, 1, 0}));
  Tensor m = tensor(std::vector<double>{2, 1, 2, 0}, {4}, d);
  EXPECT_EQ(host_values(grad([](const Tensor& x) { return max(x); })(m)),
            (std::vector<double>{0.5, 0, 0.5, 0}));
  Tensor z = tensor(std::vector<double>{-1, 0, 2}, {3}, d);
  EXPECT_EQ(host_values(grad([](const Tensor& x) { return sum(relu(x)); })(z)),
            (std::vector<double>{0, 0, 1}));
}

TEST(Autodiff, ZeroGradientsThroughIntegersAndComparisons) {
  const Device d = devices()[0];
  Tensor x = tensor(std::vector<double>{0.5, 1.5, -2}, {3}, d);
  auto g = grad([](const Tensor& v) {
    Tensor k = astype(astype(v, DType::i32), DType::f64);  // through an integer: no gradient
    Tensor mask = astype(greater(v, 0.0), DType::f64);
    Tensor am = astype(argmax(v), DType::f64);
    return sum(k * 3.0 + mask + am);
  })(x);
  EXPECT_EQ(host_values(g), (std::vector<double>{0, 0, 0}));
}

TEST(Autodiff, F32GradientsStayF32AndMixedPromotion) {
  const Device d = devices()[0];
  Tensor a = tensor(std::vector<float>{1, 2}, {2}, d);
  Tensor b = tensor(std::vector<double>{3, 4}, {2}, d);
  auto [ga, gb] = grad<0, 1>([](const Tensor& x, const Tensor& y) { return sum(x * y); })(a, b);
  EXPECT_EQ(ga.dtype(), DType::f32);
  EXPECT_EQ(gb.dtype(), DType::f64);
  EXPECT_EQ(host_values(ga), (std::vector<double>{3, 4}));
  EXPECT_EQ(host_values(gb), (std::vector<double>{1, 2}));
  // Through a cast to f32 and back: the cotangent is cast at each step.
  Tensor c = tensor(std::vector<double>{0.1, 0.2}, {2}, d);
  auto gc =
      grad([](const Tensor& x) { return sum(astype(astype(x, DType::f32), DType::f64) * 3.0); })(c);
  EXPECT_EQ(gc.dtype(), DType::f64);
  EXPECT_EQ(host_values(gc), (std::vector<double>{3, 3}));
}

// ---- shard_map: each collective, against finite differences of the same program.
struct SmCase {
  std::string name;
  std::vector<PartitionSpec> in_specs;
  PartitionSpec out_spec;
  std::vector<Shape> shapes;
  std::function<Tensor(Context&, const std::vector<Tensor>&)> body;
};

std::vector<SmCase> shard_map_cases() {
  using S = std::vector<Shape>;
  using V = std::vector<Tensor>;
  return {
      {"psum",
       {P("x")},
       P(),
       S{{8, 4}},
       [](Context& c, const V& v) { return c.psum(sin(v[0]), "x"); }},
      {"pmean",
       {P("x")},
       P(),
       S{{8, 4}},
       [](Context& c, const V& v) { return c.pmean(v[0] * v[0], "x"); }},
      {"all_gather",
       {P("x")},
       P("x"),
       S{{8, 4}},
       [](Context& c, const V& v) { return sin(c.all_gather(v[0], "x", 0, false))[0]; }},
      {"all_gather_tiled",
       {P("x")},
       P("x"),
       S{{8, 4}},
       [](Context& c, const V& v) { return sin(c.all_gather(v[0] * v[0], "x", 0, true)); }},
      {"psum_scatter",
       {P()},
       P("x"),
       S{{8, 4}},
       [](Context& c, const V& v) { return c.psum_scatter(sin(v[0]) * 1.5, "x", 0, true); }},
      {"psum_scatter_untiled",
       {P(None, "x")},
       P("x"),
       S{{8, 8}},
       [](Context& c, const V& v) { return c.psum_scatter(v[0] * v[0], "x", 0, false); }},
      {"ppermute_ring",
       {P("x")},
       P("x"),
       S{{8, 4}},
       [](Context& c, const V& v) {
         std::vector<std::pair<int64_t, int64_t>> perm;
         for (int64_t i = 0; i < 8; ++i) perm.emplace_back(i, (i + 1) % 8);
         return sin(c.ppermute(v[0] * v[0], "x", perm));
       }},
      {"ppermute_partial",
       {P("x")},
       P("x"),
       S{{8, 4}},
       [](Context& c, const V& v) {
         return sin(c.ppermute(v[0], "x", {{0, 3}, {3, 5}, {6, 1}})) + v[0];
       }},
      {"all_to_all",
       {P("x")},
       P("x"),
       S{{8, 16}},
       [](Context& c, const V& v) { return sin(c.all_to_all(v[0] * v[0], "x", 1, 0, true)); }},
      {"unmapped_with_mapped",
       {P("x"), P()},
       P("x"),
       S{{8, 4}, {1, 4}},
       [](Context&, const V& v) { return sin(v[0] * v[1]); }},
      {"dp_loss",
       {P("x"), P()},
       P(),
       S{{8, 4}, {4, 4}},
       [](Context& c, const V& v) { return c.pmean(mean(log_softmax(matmul(v[0], v[1]))), "x"); }},
      {"invariant_out_mapped",
       {P()},
       P("x"),
       S{{1, 4}},
       [](Context&, const V& v) { return sin(v[0]); }},
  };
}

TEST(AutodiffFd, ShardMapWithEachCollective) {
  Mesh mesh = make_mesh({8}, {"x"});
  for (const SmCase& c : shard_map_cases()) {
    SCOPED_TRACE(c.name);
    auto f = [&](const std::vector<Array>& xs) {
      return detail::run_shard_map(
                 [&](Context& ctx, const std::vector<Tensor>& b) {
                   return std::vector<Tensor>{c.body(ctx, b)};
                 },
                 mesh, c.in_specs, {c.out_spec}, xs, {})
          .front();
    };
    auto make = [&](const std::vector<double>& v, const Shape& s, size_t i) {
      return device_put(v, s, NamedSharding(mesh, c.in_specs[i]));
    };
    auto weights = [&](const Shape& s) {
      return device_put(random_values(static_cast<size_t>(shape_size(s)), 99, false), s,
                        NamedSharding(mesh, P()));
    };
    check_against_fd<Array>(c.name, f, c.shapes, false, make, weights);
  }
}

TEST(Autodiff, DataParallelStepCommunicatesOncePerParameter) {
  Mesh mesh = make_mesh({8}, {"x"});
  auto x = device_put(random_values(16 * 8, 1, false), {16, 8}, NamedSharding(mesh, P("x")));
  auto w1 = device_put(random_values(8 * 8, 2, false), {8, 8}, NamedSharding(mesh, P()));
  auto b1 = device_put(random_values(8, 3, false), {8}, NamedSharding(mesh, P()));
  auto w2 = device_put(random_values(8 * 4, 4, false), {8, 4}, NamedSharding(mesh, P()));
  auto loss = [&](const std::vector<Array>& p) {
    return -mean(sum(log_softmax(matmul(relu(matmul(x, p[0]) + p[1]), p[2])), 1));
  };
  CollectiveLog log;
  std::vector<Array> g;
  {
    auto on = log.record();
    g = grad(loss)(std::vector<Array>{w1, b1, w2});
  }
  int psums = 0;
  for (const auto& e : log.entries()) {
    EXPECT_EQ(e.collective, "psum") << log.str();
    ++psums;
  }
  EXPECT_EQ(psums, 3) << log.str();  // one per parameter (the loss read is outside the log)
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(g[i].sharding().is_fully_replicated());
}

TEST(Autodiff, FsdpStepReduceScattersEachShardedParameter) {
  Mesh mesh = make_mesh({8}, {"x"});
  auto x = device_put(random_values(16 * 8, 1, false), {16, 8}, NamedSharding(mesh, P("x")));
  auto w1 = device_put(random_values(8 * 16, 2, false), {8, 16}, NamedSharding(mesh, P("x")));
  auto w2 = device_put(random_values(16 * 8, 4, false), {16, 8}, NamedSharding(mesh, P("x")));
  auto loss = [&](const std::vector<Array>& p) {
    return -mean(sum(log_softmax(matmul(relu(matmul(x, p[0])), p[1])), 1));
  };
  CollectiveLog log;
  std::vector<Array> g;
  {
    auto on = log.record();
    g = grad(loss)(std::vector<Array>{w1, w2});
  }
  int scatters = 0;
  for (const auto& e : log.entries()) {
    EXPECT_NE(e.collective, "psum") << "FSDP gradients reduce-scatter, never psum + slice\n"
                                    << log.str();
    scatters += e.collective == "psum_scatter";
  }
  EXPECT_EQ(scatters, 2) << log.str();
  EXPECT_TRUE(g[0].sharding() == w1.sharding());
  EXPECT_TRUE(g[1].sharding() == w2.sharding());
}

// ---- API forms
TEST(Autodiff, ArgnumsVjpJvpAndStopGradient) {
  const Device d = devices()[0];
  Tensor a = tensor(std::vector<double>{1, 2, 3}, {3}, d);
  Tensor b = tensor(std::vector<double>{4, 5, 6}, {3}, d);
  auto f = [](const Tensor& x, const Tensor& y) { return sum(x * x * y); };
  auto [v, gs] = value_and_grad<0, 1>(f)(a, b);
  EXPECT_DOUBLE_EQ(host_values(v)[0], 4 + 20 + 54);
  EXPECT_EQ(host_values(std::get<0>(gs)), (std::vector<double>{8, 20, 36}));
  EXPECT_EQ(host_values(std::get<1>(gs)), (std::vector<double>{1, 4, 9}));
  EXPECT_EQ(host_values(grad<1>(f)(a, b)), (std::vector<double>{1, 4, 9}));

  auto [out, pullback] = vjp([](const Tensor& x, const Tensor& y) { return x * y; }, a, b);
  auto [ga, gb] = pullback(tensor(std::vector<double>{1, 0, 2}, {3}, d));
  EXPECT_EQ(host_values(ga), (std::vector<double>{4, 0, 12}));
  EXPECT_EQ(host_values(gb), (std::vector<double>{1, 0, 6}));
  EXPECT_MESHRT_ERROR(pullback(tensor(std::vector<double>{1, 0, 2}, {3}, d)), "pullback", "once");

  auto [y, t] = jvp([](const Tensor& x, const Tensor& w) { return sin(x) * w; },
                    std::make_tuple(a, b), std::make_tuple(b, a));
  std::vector<double> expect;
  for (int i = 0; i < 3; ++i) {
    const double xi = i + 1, wi = i + 4;
    expect.push_back(std::cos(xi) * wi * wi + std::sin(xi) * xi);
  }
  const std::vector<double> got = host_values(t);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(got[static_cast<size_t>(i)], expect[static_cast<size_t>(i)], 1e-12);

  auto g = grad([](const Tensor& x) { return sum(x * stop_gradient(x)); })(a);
  EXPECT_EQ(host_values(g), (std::vector<double>{1, 2, 3}));
}

TEST(Autodiff, GradOfGrad) {
  const Device d = devices()[0];
  Tensor x = tensor(std::vector<double>{0.5, -1, 2}, {3}, d);
  auto first = [](const Tensor& v) { return sum(v * v * v); };
  auto second = grad([&](const Tensor& v) { return sum(grad(first)(v) * sin(v)); })(x);
  // d/dx sum(3x^2 sin x) = 6x sin x + 3x^2 cos x
  const std::vector<double> got = host_values(second);
  for (size_t i = 0; i < 3; ++i) {
    const double v = std::vector<double>{0.5, -1, 2}[i];
    EXPECT_NEAR(got[i], 6 * v * std::sin(v) + 3 * v * v * std::cos(v), 1e-12);
  }
}

struct Mlp {
  Array w1, w2;
  std::vector<Array> biases;
  int layers = 2;
};
MESHRT_TREE(Mlp, w1, w2, biases, layers);

TEST(Autodiff, TreeArgumentGivesTreeOfGradients) {
  Mesh mesh = make_mesh({8}, {"x"});
  Mlp p{device_put(random_values(8 * 8, 1, false), {8, 8}, NamedSharding(mesh, P(None, "x"))),
        device_put(random_values(8 * 4, 2, false), {8, 4}, NamedSharding(mesh, P("x"))),
        {device_put(random_values(8, 3, false), {8}, NamedSharding(mesh, P("x"))),
         device_put(random_values(4, 4, false), {4}, NamedSharding(mesh, P()))},
        7};
  auto x = device_put(random_values(16 * 8, 5, false), {16, 8}, NamedSharding(mesh, P()));
  auto loss = [](const Mlp& m, const Array& in) {
    return mean(tanh(matmul(relu(matmul(in, m.w1) + m.biases[0]), m.w2) + m.biases[1]));
  };
  auto [l, g] = value_and_grad(loss)(p, x);
  EXPECT_EQ(g.layers, 7);  // static fields pass through
  ASSERT_EQ(g.biases.size(), 2u);
  EXPECT_TRUE(g.w1.sharding() == p.w1.sharding());
  EXPECT_TRUE(g.w2.sharding() == p.w2.sharding());
  EXPECT_TRUE(g.biases[0].sharding() == p.biases[0].sharding());
  // Against the same gradient taken with the parameters as a flat list.
  auto flat = grad([&](const std::vector<Array>& v) {
    return mean(tanh(matmul(relu(matmul(x, v[0]) + v[2]), v[1]) + v[3]));
  })(std::vector<Array>{p.w1, p.w2, p.biases[0], p.biases[1]});
  EXPECT_EQ(host_values(g.w1), host_values(flat[0]));
  EXPECT_EQ(host_values(g.biases[1]), host_values(flat[3]));
}

// ---- errors
TEST(AutodiffErrors, SayWhatWentWrong) {
  const Device d = devices()[0];
  Tensor x = tensor(std::vector<double>{1, 2}, {2}, d);
  EXPECT_MESHRT_ERROR(grad([](const Tensor& v) { return v * 2.0; })(x), "scalar", "(2,)", "vjp");
  Tensor i = tensor(std::vector<int32_t>{1, 2}, {2}, d);
  EXPECT_MESHRT_ERROR(grad([](const Tensor& v) { return sum(astype(v, DType::f32)); })(i), "int32",
                      "args[0]");
  EXPECT_MESHRT_ERROR(grad([](const Tensor& v) {
                        (void)v.to_vector<double>();
                        return sum(v);
                      })(x),
                      "to_vector", "args[0]", "stop_gradient");
  EXPECT_MESHRT_ERROR(grad<1>([](const Tensor& v, int) { return sum(v); })(x, 3), "argument 1",
                      "no Array or Tensor");
  std::vector<Tensor> leaves{x, tensor(std::vector<int32_t>{1}, {1}, d)};
  EXPECT_MESHRT_ERROR(grad([](const std::vector<Tensor>& v) { return sum(v[0]); })(leaves),
                      "args[0][1]", "int32");
  Mesh mesh = make_mesh({8}, {"x"});
  auto a = device_put(random_values(8, 1, false), {8}, NamedSharding(mesh, P("x")));
  EXPECT_MESHRT_ERROR(
      grad([&](const Array& v) {
        return sum(shard_map([](Context& c, const Tensor& b) { return c.pmax(b, "x"); }, mesh,
                             {P("x")}, P())(v));
      })(a),
      "pmax", "no derivative");
}

TEST(Autodiff, ManyStepsDoNotGrowMemory) {
  // Each backward pass frees its tape: after warm-up, steps hold the same bytes.
  Mesh mesh = make_mesh({8}, {"x"});
  auto x = device_put(random_values(16 * 8, 1, false), {16, 8}, NamedSharding(mesh, P("x")));
  std::vector<Array> p{device_put(random_values(64, 2, false), {8, 8}, NamedSharding(mesh, P()))};
  auto loss = [&](const std::vector<Array>& v) { return mean(tanh(matmul(x, v[0]))); };
  auto step = [&] {
    auto g = grad(loss)(p);
    p[0] = p[0] - 0.1 * g[0];
  };
  for (int i = 0; i < 10; ++i) step();
  const int64_t before = memory_stats().bytes_in_use;
  for (int i = 0; i < 1000; ++i) step();
  EXPECT_EQ(memory_stats().bytes_in_use, before);
  // And a vjp whose pullback never runs frees its record when dropped.
  {
    auto [out, pullback] = vjp([&](const Array& w) { return tanh(matmul(x, w)); }, p[0]);
    EXPECT_GT(memory_stats().bytes_in_use, before);
  }
  EXPECT_EQ(memory_stats().bytes_in_use, before);
}

}  // namespace
}  // namespace meshrt
