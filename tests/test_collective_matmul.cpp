// Collective matmul: every variant equals lhs @ rhs computed on the host, on 2, 4 and 8 devices,
// on non-square shapes, in float32 (|error| <= 1e-4 * (1 + |value|)) and float64 (1e-10); uneven
// shapes are rejected with an error.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"

namespace meshrt {
namespace {

using collective_matmul::Variant;

std::vector<double> host_matmul(const std::vector<double>& a, const std::vector<double>& b,
                                int64_t m, int64_t k, int64_t n) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t q = 0; q < k; ++q) {
      for (int64_t j = 0; j < n; ++j)
        c[static_cast<size_t>(i * n + j)] +=
            a[static_cast<size_t>(i * k + q)] * b[static_cast<size_t>(q * n + j)];
    }
  }
  return c;
}

struct Case {
  int64_t devices;
  DType dtype;
};

class CollectiveMatmul : public ::testing::TestWithParam<Case> {};

TEST_P(CollectiveMatmul, EveryVariantEqualsTheHostProduct) {
  // Not a structured binding: the lambdas below capture dt (clang < 16 refuses captured bindings).
  const int64_t nd = GetParam().devices;
  const DType dt = GetParam().dtype;
  Mesh mesh = make_mesh({nd}, {"i"});
  const int64_t m = 2 * nd * 3, k = 2 * nd * 5, n = 7;
  Device d0 = devices()[0];
  std::vector<double> a = random::normal_values(random::key(1), {m, k}, DType::f64);
  std::vector<double> b = random::normal_values(random::key(2), {k, n}, DType::f64);
  if (dt == DType::f32) {
    for (double& v : a) v = static_cast<float>(v);
    for (double& v : b) v = static_cast<float>(v);
  }
  const std::vector<double> want = host_matmul(a, b, m, k, n);
  auto put = [&](const std::vector<double>& v, Shape s) {
    if (dt == DType::f64) return device_put(v, s, SingleDeviceSharding(d0));
    return device_put(std::vector<float>(v.begin(), v.end()), s, SingleDeviceSharding(d0));
  };
  Array A = put(a, {m, k}), B = put(b, {k, n});
  const double tol = dt == DType::f32 ? 1e-4 : 1e-10;
  for (Variant v : {Variant::naive, Variant::overlapped, Variant::bidirectional}) {
    for (bool rs : {false, true}) {
      Array c = rs ? collective_matmul::matmul_reduce_scatter(A, B, mesh, "i", v)
                   : collective_matmul::allgather_matmul(A, B, mesh, "i", v);
      ASSERT_EQ(c.shape(), (Shape{m, n}));
      EXPECT_TRUE(c.sharding().is_equivalent_to(NamedSharding(mesh, P("i", None)), {m, n}));
      std::vector<double> got;
      if (dt == DType::f64)
        got = c.to_vector<double>();
      else
        for (float f : c.to_vector<float>()) got.push_back(f);
      for (size_t e = 0; e < got.size(); ++e) {
        ASSERT_NEAR(got[e], want[e], tol * (1 + std::fabs(want[e])))
            << (rs ? "matmul_reduce_scatter " : "allgather_matmul ")
            << collective_matmul::variant_name(v) << " on " << nd << " devices, element " << e;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, CollectiveMatmul,
                         ::testing::Values(Case{1, DType::f32}, Case{2, DType::f32},
                                           Case{4, DType::f32}, Case{8, DType::f32},
                                           Case{2, DType::f64}, Case{4, DType::f64},
                                           Case{8, DType::f64}),
                         [](const auto& info) {
                           return std::to_string(info.param.devices) + "_" +
                                  std::string(dtype_name(info.param.dtype));
                         });

TEST(CollectiveMatmulErrors, UnevenShapes) {
  Mesh mesh = make_mesh({4}, {"i"});
  Device d0 = devices()[0];
  auto arr = [&](Shape s) {
    return device_put(std::vector<float>(static_cast<size_t>(shape_size(s)), 1.f), s,
                      SingleDeviceSharding(d0));
  };
  // k = 12 splits over 4 devices but not in 8 half-blocks.
  EXPECT_MESHRT_ERROR(collective_matmul::allgather_matmul(arr({8, 12}), arr({12, 3}), mesh, "i",
                                                          Variant::bidirectional),
                      "[collective_matmul] allgather_matmul (bidirectional)",
                      "12 must be divisible by 8");
  EXPECT_EQ(collective_matmul::allgather_matmul(arr({8, 12}), arr({12, 3}), mesh, "i",
                                                Variant::overlapped)
                .shape(),
            (Shape{8, 3}));
  // 12 rows of lhs: fine for naive/overlapped on 4 devices, not for bidirectional.
  EXPECT_MESHRT_ERROR(collective_matmul::matmul_reduce_scatter(arr({12, 8}), arr({8, 3}), mesh, "i",
                                                               Variant::bidirectional),
                      "matmul_reduce_scatter (bidirectional)",
                      "the number of lhs rows 12 must be divisible by 8");
  // Shapes that do not shard at all are shard_map's error.
  EXPECT_MESHRT_ERROR(
      collective_matmul::allgather_matmul(arr({6, 8}), arr({8, 3}), mesh, "i", Variant::naive),
      "[shard_map]", "4 does not evenly divide 6");
  EXPECT_MESHRT_ERROR(
      collective_matmul::matmul_reduce_scatter(arr({8, 8}), arr({6, 3}), mesh, "i", Variant::naive),
      "[shard_map]");
}

}  // namespace
}  // namespace meshrt
