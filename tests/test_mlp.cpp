// The seed MLP (JAX's shard_map tutorial): every strategy's loss and every gradient, taken with
// value_and_grad (global-view ops and shard_map) and by the hand-written backward pass, equal
// the single-device hand-written values (float32; |diff| <= 2e-4 * (1 + |value|)) on 1, 2, 4 and
// 8 devices, and a few SGD steps lower the loss identically. Mixed precision (bf16 layers, float32
// master parameters and loss) under DP and FSDP: float32 gradients, losses tracking the float32
// run, and JAX's values for the same recipe (tests/data/gen_mlp_mixed.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "examples/mlp/mlp.h"
#include "tests/test_util.h"

namespace {

using namespace meshrt;
using mlp::Strategy;
using mlp::Style;

const std::vector<int64_t> kSizes{784, 128, 128, 128, 128, 128, 8};

Mesh mesh_for(Strategy s, int64_t n) {
  if (s == Strategy::data_tensor_2d) {
    const int64_t a = n >= 4 ? n / 2 : n,
                  b = n / a;  // 8 -> (4, 2), 4 -> (2, 2), 2 -> (2, 1), 1 -> (1, 1)
    return make_mesh({a, b}, {"batch", "feats"});
  }
  return make_mesh({n}, {s == Strategy::tensor_parallel ? "feats" : "batch"});
}

class Mlp : public ::testing::TestWithParam<int64_t> {};

TEST_P(Mlp, EveryStrategyMatchesTheSingleDeviceLossAndGradients) {
  const int64_t n = GetParam();
  mlp::Problem p = mlp::init(random::key(0), kSizes, 32);
  const mlp::Grads ref =
      mlp::loss_and_grad(p, Strategy::single, make_mesh({1}, {"x"}), Style::hand_written);
  EXPECT_GT(ref.loss, 0);
  for (Style style : {Style::hand_written, Style::global_view, Style::shard_map}) {
    for (Strategy s : {Strategy::single, Strategy::data_parallel, Strategy::fsdp,
                       Strategy::tensor_parallel, Strategy::data_tensor_2d}) {
      const mlp::Grads g = mlp::loss_and_grad(p, s, mesh_for(s, n), style);
      ASSERT_EQ(g.dW.size(), ref.dW.size());
      for (size_t l = 0; l < g.dW.size(); ++l) {
        ASSERT_EQ(g.dW[l].size(), ref.dW[l].size());
        ASSERT_EQ(g.db[l].size(), ref.db[l].size());
      }
      EXPECT_LT(mlp::max_rel_diff(g, ref), 2e-4)
          << mlp::name(s) << " (" << mlp::name(style) << ") on " << n << " devices";
    }
  }
}

TEST_P(Mlp, SgdLowersTheLossIdentically) {
  const int64_t n = GetParam();
  for (Strategy s : {Strategy::data_parallel, Strategy::fsdp, Strategy::tensor_parallel,
                     Strategy::data_tensor_2d}) {
    mlp::Problem a = mlp::init(random::key(0), kSizes, 32), b = a;
    double prev = 1e300;
    for (int step = 0; step < 3; ++step) {
      const mlp::Grads ga =
          mlp::loss_and_grad(a, Strategy::single, make_mesh({1}, {"x"}), Style::hand_written);
      const mlp::Grads gb = mlp::loss_and_grad(b, s, mesh_for(s, n), Style::global_view);
      EXPECT_NEAR(gb.loss, ga.loss, 2e-4 * (1 + ga.loss)) << mlp::name(s) << " step " << step;
      EXPECT_LT(ga.loss, prev) << "the loss falls";
      prev = ga.loss;
      mlp::sgd_step(a, ga, 0.001f);  // 0.01 overshoots on this problem (JAX too: 11.92 -> 49.49)
      mlp::sgd_step(b, gb, 0.001f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Mlp, ::testing::Values(1, 2, 4, 8));

// The hand-written backward pass against jax.value_and_grad on the same problem
// (tests/data/gen_mlp.py): loss, per-layer sums and sums of squares, first entries, and the loss
// after one SGD step.
class MlpJax : public ::testing::TestWithParam<Style> {};

TEST_P(MlpJax, LossAndGradientsMatchJaxAutodiff) {
  mlp::Problem p = mlp::init(random::key(0), kSizes, 32);
  const mlp::Grads g = mlp::loss_and_grad(p, Strategy::single, make_mesh({1}, {"x"}), GetParam());
  std::ifstream in(test::test_data_dir() + "/mlp_expected.txt");
  ASSERT_TRUE(in) << "tests/data/mlp_expected.txt";
  auto close = [](double got, double want, const std::string& what) {
    EXPECT_NEAR(got, want, 1e-4 * (1 + std::fabs(want))) << what;
  };
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "loss") {
      double v;
      ls >> v;
      close(g.loss, v, "loss");
    } else if (key == "loss_after_sgd") {
      double lr, v;
      ls >> lr >> v;
      mlp::Problem q = p;
      mlp::sgd_step(q, g, static_cast<float>(lr));
      close(mlp::loss_and_grad(q, Strategy::single, make_mesh({1}, {"x"})).loss, v,
            "loss after sgd");
    } else {
      const bool w = key[1] == 'W';
      const size_t l = std::stoul(key.substr(2));
      const std::vector<float>& t = w ? g.dW[l] : g.db[l];
      double sum, sq, sum_got = 0, sq_got = 0;
      ls >> sum >> sq;
      for (float v : t) {
        sum_got += v;
        sq_got += double(v) * v;
      }
      close(sum_got, sum, key + " sum");
      close(sq_got, sq, key + " sum of squares");
      for (size_t i = 0; i < 4; ++i) {
        double v;
        ls >> v;
        close(t[i], v, key + "[" + std::to_string(i) + "]");
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 15);
}

INSTANTIATE_TEST_SUITE_P(Styles, MlpJax,
                         ::testing::Values(Style::global_view, Style::shard_map,
                                           Style::hand_written),
                         [](const auto& info) {
                           return std::string(info.param == Style::global_view ? "global_view"
                                              : info.param == Style::shard_map ? "shard_map"
                                                                               : "hand_written");
                         });

TEST(MlpInit, MatchesJaxInitLayout) {
  mlp::Problem p = mlp::init(random::key(0), kSizes, 32);
  ASSERT_EQ(p.W.size(), 6u);
  EXPECT_EQ(p.W[0].size(), 784u * 128u);
  EXPECT_EQ(p.b[5].size(), 8u);
  EXPECT_EQ(p.x.size(), 32u * 784u);
  EXPECT_EQ(p.y.size(), 32u * 8u);
  // W = normal(k1, (n_in, n_out)) / sqrt(n_in), with k1 = split(split(key(0), 7)[1])[0].
  auto k1 = random::split(random::split(random::key(0), 7)[1])[0];
  EXPECT_FLOAT_EQ(p.W[0][0],
                  static_cast<float>(random::normal_values(k1, {784, 128}, DType::f32)[0]) / 28.0f);
}

// Mixed precision (float32 master parameters, bfloat16 layers, float32 loss) on 8 devices, DP
// and FSDP through the global view: float32 gradients sharded like the parameters, a loss that
// tracks the float32 run's from the same init and data, and both against JAX's jitted training
// of the same recipe (tests/data/gen_mlp_mixed.py).
constexpr int kMixedSteps = 5;
constexpr float kMixedLr = 0.001f;
// bfloat16 keeps 8 significant bits (relative rounding up to 2^-9): JAX's own bf16 run is within
// 0.3% of its float32 run over these steps; 1% leaves room for another summation order.
constexpr double kMixedVsF32 = 1e-2;

class MlpMixed : public ::testing::TestWithParam<Strategy> {};

TEST_P(MlpMixed, GradientsAreFloat32ShardedLikeTheParameters) {
  const Mesh mesh = make_mesh({8}, {"batch"});
  mlp::Problem p = mlp::init(random::key(0), kSizes, 32);
  const mlp::Placement at = mlp::placement(GetParam(), mesh);
  const mlp::Params params = mlp::device_put_params(p, GetParam(), mesh);
  const Array x = device_put(p.x, {p.batch, kSizes.front()}, NamedSharding(mesh, at.x));
  const Array y = device_put(p.y, {p.batch, kSizes.back()}, NamedSharding(mesh, at.x));
  auto [l, g] = value_and_grad(mlp::Loss{mlp::Precision::bf16})(params, x, y);
  EXPECT_EQ(l.dtype(), DType::f32);
  for (size_t i = 0; i < g.W.size(); ++i) {
    EXPECT_EQ(g.W[i].dtype(), DType::f32) << "dW" << i;
    EXPECT_EQ(g.b[i].dtype(), DType::f32) << "db" << i;
    EXPECT_EQ(g.W[i].sharding(), params.W[i].sharding()) << "dW" << i;
    EXPECT_EQ(g.b[i].sharding(), params.b[i].sharding()) << "db" << i;
  }
  // The same recipe written as a shard_map body (each device casts its blocks) gives the same
  // loss and gradients within a few bfloat16 roundings.
  const mlp::Grads gv =
      mlp::loss_and_grad(p, GetParam(), mesh, Style::global_view, mlp::Precision::bf16);
  const mlp::Grads sm =
      mlp::loss_and_grad(p, GetParam(), mesh, Style::shard_map, mlp::Precision::bf16);
  EXPECT_LT(mlp::max_rel_diff(sm, gv), 1e-2);
  EXPECT_THROW(mlp::loss_and_grad(p, GetParam(), mesh, Style::hand_written, mlp::Precision::bf16),
               std::invalid_argument);
}

TEST_P(MlpMixed, Bf16LossTracksTheFloat32Run) {
  const Mesh mesh = make_mesh({8}, {"batch"});
  mlp::Problem p = mlp::init(random::key(0), kSizes, 32);
  const std::vector<double> f32 =
      mlp::train_losses(p, GetParam(), mesh, mlp::Precision::f32, kMixedSteps, kMixedLr);
  const std::vector<double> bf16 =
      mlp::train_losses(p, GetParam(), mesh, mlp::Precision::bf16, kMixedSteps, kMixedLr);
  ASSERT_EQ(bf16.size(), f32.size());
  for (size_t i = 0; i < f32.size(); ++i) {
    EXPECT_NEAR(bf16[i], f32[i], kMixedVsF32 * f32[i]) << "step " << i;
    if (i > 0) EXPECT_LT(bf16[i], bf16[i - 1]) << "the bf16 loss falls, step " << i;
  }
  EXPECT_NE(bf16[0], f32[0]) << "the bf16 run computes in bfloat16";
}

// Against JAX: the losses of 5 steps (float32 within 1e-4 relative; bf16 within 2e-3: XLA sums
// each product in another float32 order, which moves some bfloat16 roundings by one unit (2^-8
// relative); seen here: up to 8e-4), and the first step's gradients (data parallel): sum of
// squares and the first entries, float32 within 1e-4, bf16 within 1e-2 relative and of
// (1 + |value|) (one bfloat16 unit of the largest entries is 4e-3; seen: up to 3.3e-3). Every
// bf16-run gradient entry is a bfloat16 value (the transpose of astype casts it to float32).
TEST_P(MlpMixed, MatchesJaxMixedPrecisionTraining) {
  const Strategy s = GetParam();
  const std::string strategy = s == Strategy::fsdp ? "fsdp" : "dp";
  const Mesh mesh = make_mesh({8}, {"batch"});
  mlp::Problem p = mlp::init(random::key(0), kSizes, 32);
  std::map<std::string, std::vector<double>> losses;
  std::map<std::string, mlp::Grads> grads;
  for (mlp::Precision pr : {mlp::Precision::f32, mlp::Precision::bf16}) {
    const std::string key = pr == mlp::Precision::f32 ? "f32" : "bf16";
    losses[key] = mlp::train_losses(p, s, mesh, pr, kMixedSteps, kMixedLr);
    grads[key] = mlp::loss_and_grad(p, s, mesh, Style::global_view, pr);
  }
  std::ifstream in(test::test_data_dir() + "/mlp_mixed_expected.txt");
  ASSERT_TRUE(in) << "tests/data/mlp_mixed_expected.txt";
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind, a, b;
    ls >> kind >> a;
    if (kind == "loss") {
      int step;
      double want;
      ls >> b >> step >> want;
      if (a != strategy) continue;
      const double tol = b == "f32" ? 1e-4 : 2e-3;
      ASSERT_LT(step, kMixedSteps);
      EXPECT_NEAR(losses[b][step], want, tol * want) << a << " " << b << " step " << step;
      ++checked;
    } else if (kind == "grad_dtype") {
      ls >> b;
      EXPECT_EQ(b, "float32") << a;  // JAX's gradients through the casts: float32
    } else if (kind == "grad") {
      double sum, sq;
      ls >> b >> sum >> sq;
      const mlp::Grads& g = grads[a];
      const size_t l = std::stoul(b.substr(2));
      const std::vector<float>& t = b[1] == 'W' ? g.dW[l] : g.db[l];
      const double tol = a == "f32" ? 1e-4 : 1e-2;
      double sq_got = 0;
      for (float v : t) sq_got += double(v) * v;
      if (a == "bf16") {
        for (float v : t) ASSERT_EQ(static_cast<float>(bfloat16(v)), v) << b << " is bfloat16";
      }
      EXPECT_NEAR(sq_got, sq, tol * sq) << a << " " << b << " sum of squares";
      for (size_t i = 0; i < 4; ++i) {
        double v;
        ls >> v;
        EXPECT_NEAR(t[i], v, tol * (1 + std::fabs(v))) << a << " " << b << "[" << i << "]";
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * kMixedSteps + 24);
}

INSTANTIATE_TEST_SUITE_P(Strategies, MlpMixed,
                         ::testing::Values(Strategy::data_parallel, Strategy::fsdp),
                         [](const auto& info) {
                           return std::string(info.param == Strategy::fsdp ? "fsdp" : "dp");
                         });

}  // namespace
