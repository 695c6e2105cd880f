// The seed MLP (JAX's shard_map tutorial): every strategy's loss and every gradient, taken with
// value_and_grad (global-view ops and shard_map) and by the hand-written backward pass, equal
// the single-device hand-written values (float32; |diff| <= 2e-4 * (1 + |value|)) on 1, 2, 4 and
// 8 devices, and a few SGD steps lower the loss identically.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
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

}  // namespace
