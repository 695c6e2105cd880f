// Collective conformance: every collective, every ordered tuple of mesh axes, tiled and untiled,
// on meshes of 1, 2, 3, 4 and 8 devices, against the independent host model. Written once and
// instantiated per platform (cuda cases skip where no GPU is usable).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/config.h"
#include "tests/collective_harness.h"

namespace meshrt {
namespace {

using test::HostArr;
using test::MeshCase;

// Each case runs under one algorithm (MESHRT_COLLECTIVE_ALGO, read when a launch begins).
class Collectives : public ::testing::TestWithParam<MeshCase> {
 protected:
  void SetUp() override { setenv("MESHRT_COLLECTIVE_ALGO", GetParam().algo.c_str(), 1); }
  void TearDown() override { unsetenv("MESHRT_COLLECTIVE_ALGO"); }
};

int64_t group_size(const Mesh& mesh, const std::vector<std::string>& axes) {
  int64_t n = 1;
  for (const auto& a : axes) n *= mesh.axis_size(a);
  return n;
}

TEST_P(Collectives, Reductions) {
  MESHRT_MESH_OR_SKIP(mesh, GetParam());
  for (const auto& axes : test::axis_choices(mesh)) {
    AxisNames an(axes);
    const std::string tag = test::axes_label(axes);
    const int64_t n = group_size(mesh, axes);
    for (DType dt : {DType::i32, DType::f32, DType::f64, DType::i64}) {
      std::string w = tag + " " + std::string(dtype_name(dt));
      test::check_collective(
          mesh, axes, {3, 4}, dt, [&](Context& c, const Tensor& x) { return c.psum(x, an); },
          [](const std::vector<HostArr>& xs, int64_t) {
            return test::elementwise(xs, [](double a, double b) { return a + b; });
          },
          "psum " + w);
      test::check_collective(
          mesh, axes, {2, 3}, dt, [&](Context& c, const Tensor& x) { return c.pmax(x, an); },
          [](const std::vector<HostArr>& xs, int64_t) {
            return test::elementwise(xs, [](double a, double b) { return std::max(a, b); });
          },
          "pmax " + w);
      test::check_collective(
          mesh, axes, {2, 3}, dt, [&](Context& c, const Tensor& x) { return c.pmin(x, an); },
          [](const std::vector<HostArr>& xs, int64_t) {
            return test::elementwise(xs, [](double a, double b) { return std::min(a, b); });
          },
          "pmin " + w);
    }
    // pmean: true division; integers give floats (int32 -> float32).
    for (DType dt : {DType::i32, DType::f32, DType::f64}) {
      test::check_collective(
          mesh, axes, {2, 3}, dt,
          [&](Context& c, const Tensor& x) {
            Tensor m = c.pmean(x, an);
            EXPECT_EQ(m.dtype(), dt == DType::f64 ? DType::f64 : DType::f32);
            return m;
          },
          [&](const std::vector<HostArr>& xs, int64_t) {
            HostArr s = test::elementwise(xs, [](double a, double b) { return a + b; });
            for (double& v : s.v) {
              v = dt == DType::f64
                      ? v / static_cast<double>(n)
                      : static_cast<double>(static_cast<float>(v) / static_cast<float>(n));
            }
            return s;
          },
          "pmean " + tag + " " + std::string(dtype_name(dt)));
    }
  }
}

TEST_P(Collectives, AllGather) {
  MESHRT_MESH_OR_SKIP(mesh, GetParam());
  for (const auto& axes : test::axis_choices(mesh)) {
    AxisNames an(axes);
    const std::string tag = test::axes_label(axes);
    for (int axis : {0, 1, -1}) {
      test::check_collective(
          mesh, axes, {2, 3}, DType::i32,
          [&](Context& c, const Tensor& x) { return c.all_gather(x, an, axis, true); },
          [&](const std::vector<HostArr>& xs, int64_t) {
            return test::concat(xs, static_cast<size_t>(axis < 0 ? axis + 2 : axis));
          },
          "all_gather tiled axis=" + std::to_string(axis) + " " + tag);
    }
    for (int axis : {0, 1, 2, -1, -3}) {
      test::check_collective(
          mesh, axes, {2, 3}, DType::f32,
          [&](Context& c, const Tensor& x) { return c.all_gather(x, an, axis, false); },
          [&](const std::vector<HostArr>& xs, int64_t) {
            return test::stack(xs, static_cast<size_t>(axis < 0 ? axis + 3 : axis));
          },
          "all_gather untiled axis=" + std::to_string(axis) + " " + tag);
    }
  }
}

TEST_P(Collectives, PsumScatter) {
  MESHRT_MESH_OR_SKIP(mesh, GetParam());
  for (const auto& axes : test::axis_choices(mesh)) {
    AxisNames an(axes);
    const std::string tag = test::axes_label(axes);
    const int64_t n = group_size(mesh, axes);
    auto total = [](const std::vector<HostArr>& xs) {
      return test::elementwise(xs, [](double a, double b) { return a + b; });
    };
    test::check_collective(
        mesh, axes, {2 * n, 3}, DType::i32,
        [&](Context& c, const Tensor& x) { return c.psum_scatter(x, an, 0, true); },
        [&](const std::vector<HostArr>& xs, int64_t me) {
          return test::split_part(total(xs), n, 0, me);
        },
        "psum_scatter tiled sd=0 " + tag);
    test::check_collective(
        mesh, axes, {2, 3 * n}, DType::f64,
        [&](Context& c, const Tensor& x) { return c.psum_scatter(x, an, -1, true); },
        [&](const std::vector<HostArr>& xs, int64_t me) {
          return test::split_part(total(xs), n, 1, me);
        },
        "psum_scatter tiled sd=-1 " + tag);
    test::check_collective(
        mesh, axes, {n, 3}, DType::i64,
        [&](Context& c, const Tensor& x) { return c.psum_scatter(x, an, 0, false); },
        [&](const std::vector<HostArr>& xs, int64_t me) { return test::take(total(xs), me, 0); },
        "psum_scatter untiled sd=0 " + tag);
    test::check_collective(
        mesh, axes, {2, n}, DType::f32,
        [&](Context& c, const Tensor& x) { return c.psum_scatter(x, an, 1, false); },
        [&](const std::vector<HostArr>& xs, int64_t me) { return test::take(total(xs), me, 1); },
        "psum_scatter untiled sd=1 " + tag);
    // At least n rows before the scatter dimension, in a share that does not divide evenly: the
    // host folds whole rows and sends each member its run (direct.cpp, scatter_by_rows).
    test::check_collective(
        mesh, axes, {n + 1, 2 * n, 3}, DType::i32,
        [&](Context& c, const Tensor& x) { return c.psum_scatter(x, an, 1, true); },
        [&](const std::vector<HostArr>& xs, int64_t me) {
          return test::split_part(total(xs), n, 1, me);
        },
        "psum_scatter tiled sd=1 of 3 dims " + tag);
    test::check_collective(
        mesh, axes, {2 * n + 1, n, 2}, DType::f32,
        [&](Context& c, const Tensor& x) { return c.psum_scatter(x, an, 1, false); },
        [&](const std::vector<HostArr>& xs, int64_t me) { return test::take(total(xs), me, 1); },
        "psum_scatter untiled sd=1 of 3 dims " + tag);
    test::check_collective(
        mesh, axes, {n, n, 2}, DType::f64,
        [&](Context& c, const Tensor& x) { return c.psum_scatter(x, an, 1, true); },
        [&](const std::vector<HostArr>& xs, int64_t me) {
          return test::split_part(total(xs), n, 1, me);
        },
        "psum_scatter tiled sd=1 of 3 dims, f64 " + tag);
    test::check_collective(
        mesh, axes, {n + 2, 2, n}, DType::i64,
        [&](Context& c, const Tensor& x) { return c.psum_scatter(x, an, 2, true); },
        [&](const std::vector<HostArr>& xs, int64_t me) {
          return test::split_part(total(xs), n, 2, me);
        },
        "psum_scatter tiled sd=2 of 3 dims, i64 " + tag);
  }
}

// A psum_scatter along a trailing dimension adds the same floats in the same order as psum:
// each member's result is, bit for bit, its columns of the psum.
TEST(CollectivesBits, PsumScatterAlongColumnsIsItsColumnsOfThePsum) {
  if (devices("cpu").size() < 8) GTEST_SKIP() << "needs 8 cpu devices";
  Mesh mesh = make_mesh({8}, {"x"}, "cpu");
  const int64_t rows = 64, cols = 8 * 32;
  std::vector<float> host(static_cast<size_t>(8 * rows * cols));
  uint32_t state = 12345;
  for (float& v : host) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(state >> 8)) * 1e-6f;
  }
  Array x = device_put(host, {8 * rows, cols}, NamedSharding(mesh, P("x")));
  auto f = shard_map(
      [](Context& ctx, const Tensor& t) {
        const CollectiveOptions direct{CollectiveAlgo::direct};
        const Tensor sum = ctx.psum(t, "x", direct);
        const int64_t me = ctx.axis_index("x");
        const Tensor mine = slice(sum, {0, me * 32}, {t.shape()[0], (me + 1) * 32});
        return std::vector<Tensor>{ctx.psum_scatter(t, "x", 1, true, direct), copy(mine)};
      },
      mesh, {P("x")}, {P("x"), P("x")});
  std::vector<Array> out = f(x);
  EXPECT_EQ(out[0].to_vector<float>(), out[1].to_vector<float>());
}

// A direct psum/pmean/pmax above the small size (folded in slices, fewer slices than members on
// the host) gives, in every output, each element folded over the members in group order in the
// input's precision: the bits of a host fold in that order. Values of mixed magnitudes, so that
// another order would give other bits; sizes that split into uneven slices.
TEST(CollectivesBits, LargeReductionsFoldInMemberOrder) {
  if (devices("cpu").size() < 8) GTEST_SKIP() << "needs 8 cpu devices";
  Mesh mesh = make_mesh({2, 4}, {"a", "b"}, "cpu");
  const CollectiveOptions direct{CollectiveAlgo::direct};
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> expo(-20, 20);
  for (const std::vector<std::string>& axes :
       {std::vector<std::string>{"a", "b"}, std::vector<std::string>{"b"}}) {
    const int64_t n = axes.size() == 2 ? 8 : 4;
    for (int64_t len : {int64_t{8195}, int64_t{16384}, int64_t{3 * 16384 + 7}}) {
      std::vector<float> host(static_cast<size_t>(8 * len));
      for (float& v : host) v = std::ldexp(mant(rng), expo(rng));
      const Array x = device_put(host, {8 * len}, NamedSharding(mesh, P(Axes{"a", "b"})));
      // Member k of the group of device d: devices d' in d's group, in group order.
      auto group_of = [&](int64_t d) {
        std::vector<int64_t> g;
        for (int64_t e = 0; e < 8; ++e) {
          if (n == 8 || e / 4 == d / 4) g.push_back(e);
        }
        return g;
      };
      for (const char* op : {"psum", "pmean", "pmax"}) {
        SCOPED_TRACE(::testing::Message() << op << " over " << n << " members, " << len);
        auto f = shard_map(
            [&](Context& c, const Tensor& t) {
              AxisNames an(axes);
              if (std::string(op) == "psum") return c.psum(t, an, direct);
              if (std::string(op) == "pmean") return c.pmean(t, an, direct);
              return c.pmax(t, an, direct);
            },
            mesh, {P(Axes{"a", "b"})}, P(Axes{"a", "b"}));
        const std::vector<float> got = f(x).to_vector<float>();
        for (int64_t d = 0; d < 8; ++d) {
          const std::vector<int64_t> g = group_of(d);
          for (int64_t e = 0; e < len; ++e) {
            float acc = host[static_cast<size_t>(g[0] * len + e)];
            for (size_t k = 1; k < g.size(); ++k) {
              const float v = host[static_cast<size_t>(g[k] * len + e)];
              acc = std::string(op) == "pmax" ? (acc < v ? v : acc) : acc + v;
            }
            if (std::string(op) == "pmean") acc = acc / static_cast<float>(g.size());
            const float y = got[static_cast<size_t>(d * len + e)];
            ASSERT_EQ(std::memcmp(&y, &acc, sizeof y), 0)
                << "device " << d << " element " << e << ": " << y << " vs " << acc;
          }
        }
      }
    }
  }
}

TEST_P(Collectives, Ppermute) {
  MESHRT_MESH_OR_SKIP(mesh, GetParam());
  for (const auto& axes : test::axis_choices(mesh)) {
    if (!test::in_mesh_order(mesh, axes)) continue;  // other orders are an error (ErrorCases)
    AxisNames an(axes);
    const int64_t n = group_size(mesh, axes);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> perms;
    std::vector<std::pair<int64_t, int64_t>> shift, back, partial{{0, n - 1}}, wrap{{-1, 0}};
    for (int64_t i = 0; i < n; ++i) {
      shift.emplace_back(i, (i + 1) % n);
      back.emplace_back(i, (i + n - 1) % n);
    }
    perms = {shift, back, partial, wrap, {}};
    for (const auto& perm : perms) {
      test::check_collective(
          mesh, axes, {2, 3}, DType::i32,
          [&](Context& c, const Tensor& x) { return c.ppermute(x, an, perm); },
          [&](const std::vector<HostArr>& xs, int64_t me) {
            for (auto [s, d] : perm) {
              if (((d % n) + n) % n == me) return xs[static_cast<size_t>(((s % n) + n) % n)];
            }
            HostArr z = xs[0];
            std::fill(z.v.begin(), z.v.end(), 0.0);  // nothing arrives: zeros
            return z;
          },
          "ppermute " + test::axes_label(axes) + " perm size " + std::to_string(perm.size()));
    }
  }
}

TEST_P(Collectives, AllToAll) {
  MESHRT_MESH_OR_SKIP(mesh, GetParam());
  for (const auto& axes : test::axis_choices(mesh)) {
    AxisNames an(axes);
    const std::string tag = test::axes_label(axes);
    const int64_t n = group_size(mesh, axes);
    struct TiledCase {
      int split, concat;
      Shape block;
    };
    for (const TiledCase& tc :
         {TiledCase{0, 1, {2 * n, 3}}, TiledCase{1, 0, {2, 3 * n}}, TiledCase{0, 0, {n, 2}},
          TiledCase{1, 1, {2, 2 * n}}, TiledCase{-1, 0, {3, n}}}) {
      test::check_collective(
          mesh, axes, tc.block, DType::i32,
          [&](Context& c, const Tensor& x) {
            return c.all_to_all(x, an, tc.split, tc.concat, true);
          },
          [&](const std::vector<HostArr>& xs, int64_t me) {
            size_t s = static_cast<size_t>(tc.split < 0 ? tc.split + 2 : tc.split);
            std::vector<HostArr> chunks;
            for (const HostArr& x : xs) chunks.push_back(test::split_part(x, n, s, me));
            return test::concat(chunks, static_cast<size_t>(tc.concat));
          },
          "all_to_all tiled " + std::to_string(tc.split) + "->" + std::to_string(tc.concat) + " " +
              tag);
    }
    struct UntiledCase {
      int split, concat;
      Shape block;
    };
    for (const UntiledCase& uc :
         {UntiledCase{0, 1, {n, 3}}, UntiledCase{0, 0, {n, 3}}, UntiledCase{1, 0, {2, n}},
          UntiledCase{1, 1, {2, n}}, UntiledCase{0, 1, {n, 2, 2}}}) {
      test::check_collective(
          mesh, axes, uc.block, DType::f32,
          [&](Context& c, const Tensor& x) {
            return c.all_to_all(x, an, uc.split, uc.concat, false);
          },
          [&](const std::vector<HostArr>& xs, int64_t me) {
            std::vector<HostArr> parts;
            for (const HostArr& x : xs)
              parts.push_back(test::take(x, me, static_cast<size_t>(uc.split)));
            return test::stack(parts, static_cast<size_t>(uc.concat));
          },
          "all_to_all untiled " + std::to_string(uc.split) + "->" + std::to_string(uc.concat) +
              " " + tag);
    }
  }
}

// Above the small-message threshold psum runs the two-phase tiled algorithm: check it too.
TEST_P(Collectives, LargeReductions) {
  MESHRT_MESH_OR_SKIP(mesh, GetParam());
  const auto axes = test::axis_choices(mesh);
  for (const auto& a : {axes.front(), axes.back()}) {
    AxisNames an(a);
    const int64_t n = group_size(mesh, a);
    for (Shape block : {Shape{100, 171}, Shape{3, 20000}}) {
      test::check_collective(
          mesh, a, block, DType::f32, [&](Context& c, const Tensor& x) { return c.psum(x, an); },
          [](const std::vector<HostArr>& xs, int64_t) {
            return test::elementwise(xs, [](double x, double y) { return x + y; });
          },
          "large psum " + test::axes_label(a));
      test::check_collective(
          mesh, a, block, DType::i32, [&](Context& c, const Tensor& x) { return c.pmax(x, an); },
          [](const std::vector<HostArr>& xs, int64_t) {
            return test::elementwise(xs, [](double x, double y) { return std::max(x, y); });
          },
          "large pmax " + test::axes_label(a));
      test::check_collective(
          mesh, a, block, DType::i32, [&](Context& c, const Tensor& x) { return c.pmean(x, an); },
          [&](const std::vector<HostArr>& xs, int64_t) {
            HostArr s = test::elementwise(xs, [](double x, double y) { return x + y; });
            for (double& v : s.v) v = static_cast<float>(v) / static_cast<float>(n);
            return s;
          },
          "large pmean " + test::axes_label(a));
    }
  }
}

TEST_P(Collectives, AxisIndexAndSize) {
  MESHRT_MESH_OR_SKIP(mesh, GetParam());
  for (const auto& axes : test::axis_choices(mesh)) {
    AxisNames an(axes);
    test::check_collective(
        mesh, axes, {1}, DType::i64,
        [&](Context& c, const Tensor&) {
          std::vector<int64_t> v{c.axis_index(an), c.axis_size(an)};
          return tensor(v, {2}, c.device());
        },
        [&](const std::vector<HostArr>& xs, int64_t me) {
          HostArr r = test::make_arr({2});
          r.v = {static_cast<double>(me), static_cast<double>(xs.size())};
          return r;
        },
        "axis_index " + test::axes_label(axes));
  }
}

// pmax/pmin with NaNs, as JAX 0.10.2 computes them on CPU (4 devices holding [1, 2 | nan, 3 |
// 5, nan | 0, 1]: pmax [5, 3], pmin [0, 1]; XLA's all-reduce drops a NaN met as the second
// operand). The result depends on the fold order, so this is the direct algorithm's contract.
TEST_P(Collectives, MaxMinWithNaNsAsJax) {
  MESHRT_MESH_OR_SKIP(mesh, GetParam());
  if (mesh.shape() != Shape{4} || GetParam().algo != "direct")
    GTEST_SKIP() << "the JAX reference: (4,) mesh, direct";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Array x =
      device_put(std::vector<float>{1, 2, nan, 3, 5, nan, 0, 1}, {8}, NamedSharding(mesh, P("x")));
  auto outs = shard_map(
      [](Context& c, const Tensor& t) {
        return std::vector<Tensor>{c.pmax(t, "x"), c.pmin(t, "x")};
      },
      mesh, {P("x")}, {P(), P()})(x);
  EXPECT_EQ(outs[0].to_vector<float>(), (std::vector<float>{5, 3}));
  EXPECT_EQ(outs[1].to_vector<float>(), (std::vector<float>{0, 1}));
}

std::vector<MeshCase> cuda_cases();

std::vector<MeshCase> cases_for(const std::string& algo) {
  std::vector<MeshCase> out = {{"cpu", {1}, {"x"}},         {"cpu", {2}, {"x"}},
                               {"cpu", {3}, {"x"}},         {"cpu", {4}, {"x"}},
                               {"cpu", {8}, {"x"}},         {"cpu", {4, 2}, {"x", "y"}},
                               {"cpu", {2, 4}, {"x", "y"}}, {"cpu", {2, 2, 2}, {"x", "y", "z"}},
                               {"cpu", {3, 2}, {"x", "y"}}, {"cpu", {5}, {"x"}}};
  for (MeshCase& c : cuda_cases()) out.push_back(c);
  for (MeshCase& c : out) c.algo = algo;
  return out;
}
// The cuda platform: 1 GPU x k logical devices (the cuda_k<k>. runs), or several GPUs.
std::vector<MeshCase> cuda_cases() {
  return {{"cuda", {1}, {"x"}},         {"cuda", {2}, {"x"}},
          {"cuda", {3}, {"x"}},         {"cuda", {4}, {"x"}},
          {"cuda", {8}, {"x"}},         {"cuda", {4, 2}, {"x", "y"}},
          {"cuda", {2, 4}, {"x", "y"}}, {"cuda", {2, 2, 2}, {"x", "y", "z"}}};
}
std::vector<MeshCase> native_cases() {
  std::vector<MeshCase> out = cuda_cases();
  out.push_back({"cpu", {4, 2}, {"x", "y"}});  // native is direct on cpu
  for (MeshCase& c : out) c.algo = "native";
  return out;
}
INSTANTIATE_TEST_SUITE_P(Meshes, Collectives, ::testing::ValuesIn(cases_for("direct")),
                         test::mesh_case_name);
INSTANTIATE_TEST_SUITE_P(Ring, Collectives, ::testing::ValuesIn(cases_for("ring")),
                         test::mesh_case_name);
INSTANTIATE_TEST_SUITE_P(BidiRing, Collectives, ::testing::ValuesIn(cases_for("bidi_ring")),
                         test::mesh_case_name);
INSTANTIATE_TEST_SUITE_P(Native, Collectives, ::testing::ValuesIn(native_cases()),
                         test::mesh_case_name);

// Asking for NCCL where two members share a GPU says so, and names the way out.
TEST(CudaNative, SharedGpuSaysSo) {
  auto ps = platforms();
  if (std::find(ps.begin(), ps.end(), "cuda") == ps.end())
    GTEST_SKIP() << "no usable cuda platform here";
  if (test::cuda_devices_per_gpu() < 2) GTEST_SKIP() << "needs MESHRT_CUDA_DEVICES_PER_GPU >= 2";
  Mesh mesh = make_mesh({2}, {"x"}, "cuda");
  Array x = device_put(std::vector<float>{1, 2}, {2}, NamedSharding(mesh, P("x")));
  auto run = [&](CollectiveAlgo algo) {
    return shard_map(
        [algo](Context& c, const Tensor& t) { return c.psum(t, "x", CollectiveOptions{algo}); },
        mesh, {P("x")}, P())(x);
  };
  EXPECT_MESHRT_ERROR(run(CollectiveAlgo::native), "[psum] algo native cannot serve this group",
                      "are logical devices on the same GPU 0", "NCCL refuses two ranks on one GPU",
                      "use CollectiveAlgo::direct, ring or bidi_ring");
  // automatic picks the built-in transport there.
  EXPECT_EQ(run(CollectiveAlgo::automatic).to_vector<float>(), (std::vector<float>{3}));
}

}  // namespace
}  // namespace meshrt

namespace meshrt {
namespace {

// Random non-integer floats: summation order shows in the last bits.
std::vector<float> noisy(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng) * (1.f + static_cast<float>(rng() % 1000));
  return v;
}

TEST(Algorithms, DeterministicModeGivesTheSameBitsForEveryAlgorithm) {
  struct M {
    Shape shape;
    std::vector<std::string> names;
    AxisNames axes;
  };
  for (const M& m : {M{{8}, {"x"}, "x"}, M{{3}, {"x"}, "x"}, M{{4, 2}, {"x", "y"}, {"y", "x"}}}) {
    Mesh mesh = make_mesh(m.shape, m.names);
    const int64_t per = 3000;
    Array x = device_put(noisy(static_cast<size_t>(per * mesh.size()), 7), {per * mesh.size()},
                         NamedSharding(mesh, P(Axes(mesh.axis_names()))));
    auto run = [&](CollectiveAlgo algo, bool det) {
      CollectiveOptions o{algo, det};
      return shard_map(
          [&](Context& c, const Tensor& t) {
            const int64_t n = c.axis_size(m.axes);
            return std::vector<Tensor>{
                c.psum(t, m.axes, o), c.pmean(t, m.axes, o), c.pmax(t, m.axes, o),
                c.psum_scatter(slice_in_dim(t, 0, per / n * n), m.axes, 0, true, o)};
          },
          mesh, {P(Axes(mesh.axis_names()))},
          {P(Axes(mesh.axis_names())), P(Axes(mesh.axis_names())), P(Axes(mesh.axis_names())),
           P(Axes(mesh.axis_names()))})(x);
    };
    auto bits = [](const std::vector<Array>& outs) {
      std::vector<std::vector<float>> v;
      for (const Array& a : outs) v.push_back(a.to_vector<float>());
      return v;
    };
    const auto direct = bits(run(CollectiveAlgo::direct, false));
    EXPECT_EQ(bits(run(CollectiveAlgo::direct, true)), direct) << mesh.str();
    EXPECT_EQ(bits(run(CollectiveAlgo::ring, true)), direct) << mesh.str();
    EXPECT_EQ(bits(run(CollectiveAlgo::bidi_ring, true)), direct) << mesh.str();
    // Without it, the ring's own order (starting at the next member) differs in the last bits.
    if (mesh.size() > 2)
      EXPECT_NE(bits(run(CollectiveAlgo::ring, false))[0], direct[0]) << mesh.str();
  }
}

// MESHRT_COLLECTIVE_ALGO is validated by core/config against its own list; the names it accepts
// and the ones parse_collective_algo reads are the same.
TEST(Algorithms, ConfigAndParseAcceptTheSameNames) {
  const char* before = std::getenv("MESHRT_COLLECTIVE_ALGO");
  const std::string saved = before != nullptr ? before : "";
  auto config_accepts = [](const std::string& name) {
    setenv("MESHRT_COLLECTIVE_ALGO", name.c_str(), 1);
    try {
      return config::collective_algo() == name;
    } catch (const Error&) {
      return false;
    }
  };
  std::vector<std::string> documented;  // config's table: "auto, direct, ..."
  for (const config::Variable& v : config::variables()) {
    if (v.name != "MESHRT_COLLECTIVE_ALGO") continue;
    for (size_t at = 0; at <= v.values.size();) {
      const size_t end = std::min(v.values.find(", ", at), v.values.size());
      documented.emplace_back(v.values.substr(at, end - at));
      at = end + 2;
    }
  }
  ASSERT_EQ(documented.size(), 5u);
  for (const std::string& name : documented) {
    EXPECT_TRUE(config_accepts(name)) << name;
    EXPECT_EQ(collective_algo_name(parse_collective_algo(name)), name);
  }
  for (CollectiveAlgo a : {CollectiveAlgo::automatic, CollectiveAlgo::direct, CollectiveAlgo::ring,
                           CollectiveAlgo::bidi_ring, CollectiveAlgo::native}) {
    const std::string name(collective_algo_name(a));
    EXPECT_EQ(parse_collective_algo(name), a) << name;
    EXPECT_TRUE(config_accepts(name)) << name;
    EXPECT_NE(std::find(documented.begin(), documented.end(), name), documented.end()) << name;
  }
  for (const std::string bad : {"automatic", "Ring", "bidi-ring", "nccl", " direct"}) {
    EXPECT_FALSE(config_accepts(bad)) << bad;
    EXPECT_MESHRT_ERROR(parse_collective_algo(bad), "[collective_algo] '" + bad +
                                                        "' is not one of auto, direct, ring, "
                                                        "bidi_ring, native");
  }
  if (before != nullptr)
    setenv("MESHRT_COLLECTIVE_ALGO", saved.c_str(), 1);
  else
    unsetenv("MESHRT_COLLECTIVE_ALGO");
}

}  // namespace
}  // namespace meshrt
