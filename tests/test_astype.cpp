// astype from floats to integers follows JAX/XLA on every platform: truncation toward zero,
// NaN -> 0, saturation at the integer range. Expected values are what JAX 0.10 prints for
// jnp.array([...], jnp.float32).astype(jnp.int32) and the float64/int64 forms (x64 enabled).
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace meshrt {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

template <class F, class I>
std::vector<I> cast(const std::vector<F>& in, DType to) {
  const Tensor x = tensor(in, {static_cast<int64_t>(in.size())}, devices()[0]);
  return astype(x, to).to_vector<I>();
}

TEST(Astype, FloatToIntAsJax) {
  constexpr int32_t kMin32 = INT32_MIN, kMax32 = INT32_MAX;
  constexpr int64_t kMin64 = INT64_MIN, kMax64 = INT64_MAX;
  const std::vector<double> v = {kNan, kInf, -kInf, 1e10,         -1e10,         -2.7,
                                 2.7,  0.0,  -0.5,  2147483520.0, -2147483648.0, 2147483648.0};
  std::vector<float> v32(v.begin(), v.end());

  EXPECT_EQ((cast<float, int32_t>(v32, DType::i32)),
            (std::vector<int32_t>{0, kMax32, kMin32, kMax32, kMin32, -2, 2, 0, 0, 2147483520,
                                  kMin32, kMax32}));
  EXPECT_EQ((cast<float, int64_t>(v32, DType::i64)),
            (std::vector<int64_t>{0, kMax64, kMin64, 10000000000, -10000000000, -2, 2, 0, 0,
                                  2147483520, -2147483648LL, 2147483648LL}));

  std::vector<double> v64 = v;
  v64.insert(v64.end(), {9.223372036854775807e18, -9.223372036854775808e18, 1e300, 2147483647.9,
                         -2147483648.9});
  EXPECT_EQ((cast<double, int64_t>(v64, DType::i64)),
            (std::vector<int64_t>{0, kMax64, kMin64, 10000000000, -10000000000, -2, 2, 0, 0,
                                  2147483520, -2147483648LL, 2147483648LL, kMax64, kMin64, kMax64,
                                  2147483647, -2147483648LL}));
  EXPECT_EQ((cast<double, int32_t>(v64, DType::i32)),
            (std::vector<int32_t>{0, kMax32, kMin32, kMax32, kMin32, -2, 2, 0, 0, 2147483520,
                                  kMin32, kMax32, kMax32, kMin32, kMax32, kMax32, kMin32}));
}

TEST(Astype, FullOfNanAsAnInteger) {
  // jnp.full((2,), jnp.nan, jnp.int32) is [0, 0].
  EXPECT_EQ(full({2}, kNan, DType::i32, devices()[0]).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 0}));
}

}  // namespace
}  // namespace meshrt
