// The cpu platform's 32- and 64-bit folds (backends/cpu/coll_primitives.cpp) against a scalar host
// model: each output combines its inputs one by one in source order. Bits must be equal for every
// source count the fold's passes split into (a first pass of 2-4 inputs, then passes of 4, then
// single inputs), at lengths that end in every vector tail, with the output in place of the first
// source too (as a ring's accumulation buffer is).
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "backends/cpu/coll_primitives.h"

using namespace meshrt;
using backend::FoldOp;

namespace {

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::f32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DType::f64;
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return DType::i32;
  } else {
    return DType::i64;
  }
}

// pmean's output type: the input's for floats, float32 for int32, float64 for int64.
template <class T>
using MeanOf = std::conditional_t<std::is_floating_point_v<T>, T,
                                  std::conditional_t<std::is_same_v<T, int32_t>, float, double>>;

// The host model of fold(op) for one output element; integer sums wrap.
template <class T>
T combine(FoldOp op, T acc, T v) {
  if (op == FoldOp::max) return (acc < v) ? v : acc;
  if (op == FoldOp::min) return (v < acc) ? v : acc;
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(acc) + static_cast<U>(v));
  } else {
    return acc + v;
  }
}

// Random values: for floats, a mix of zeros, Inf, NaN, subnormals and values of every magnitude
// (so sums round differently in another order); for integers, values near the type's limits (so
// sums wrap) and small ones.
template <class T>
T random_value(std::mt19937_64& rng) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (rng() % 12) {
      case 0:
        return (rng() & 1) ? T(0) : -T(0);
      case 1:
        return (rng() & 1) ? std::numeric_limits<T>::infinity()
                           : std::numeric_limits<T>::quiet_NaN();
      case 2:
        return std::numeric_limits<T>::denorm_min() * static_cast<T>(1 + rng() % 1000);
      default:
        return std::ldexp(static_cast<T>(static_cast<int64_t>(rng() % 2000001) - 1000000),
                          static_cast<int>(rng() % 60) - 30);
    }
  } else {
    if (rng() % 3 == 0) return static_cast<T>(rng());  // any bits: sums wrap
    return static_cast<T>(static_cast<int64_t>(rng() % 201) - 100);
  }
}

// Bits equal; where the model gives a NaN, any NaN (the project's rule for arithmetic NaNs: which
// operand's payload and sign NaN + NaN keeps depends on the order the compiler puts a
// commutative add's operands in, in this fold as in its model).
template <class V>
::testing::AssertionResult same(const std::vector<V>& got, const std::vector<V>& want) {
  for (size_t e = 0; e < want.size(); ++e) {
    if (std::memcmp(&got[e], &want[e], sizeof(V)) == 0) continue;
    if constexpr (std::is_floating_point_v<V>) {
      if (std::isnan(got[e]) && std::isnan(want[e])) continue;
    }
    return ::testing::AssertionFailure()
           << "element " << e << ": got " << got[e] << ", want " << want[e];
  }
  return ::testing::AssertionSuccess();
}

template <class T>
void check_dtype() {
  std::mt19937_64 rng(3100 + sizeof(T) + std::is_integral_v<T>);
  const DType dt = dtype_of<T>();
  for (FoldOp op : {FoldOp::sum, FoldOp::max, FoldOp::min, FoldOp::mean}) {
    for (size_t n = 1; n <= 13; ++n) {
      for (size_t len : {size_t{1}, size_t{3}, size_t{17}, size_t{1024}, size_t{1031}}) {
        std::vector<std::vector<T>> in(n, std::vector<T>(len));
        for (auto& v : in)
          for (auto& x : v) x = random_value<T>(rng);
        using Out = MeanOf<T>;
        std::vector<T> want(len);
        std::vector<Out> want_mean(len);
        for (size_t e = 0; e < len; ++e) {
          T acc = in[0][e];
          for (size_t j = 1; j < n; ++j)
            acc = combine(op == FoldOp::mean ? FoldOp::sum : op, acc, in[j][e]);
          want[e] = acc;
          want_mean[e] = static_cast<Out>(acc) / static_cast<Out>(n);
        }
        std::vector<const void*> srcs;
        for (auto& v : in) srcs.push_back(v.data());
        const auto m = static_cast<int64_t>(len);
        const char* op_name = op == FoldOp::sum   ? "sum"
                              : op == FoldOp::max ? "max"
                              : op == FoldOp::min ? "min"
                                                  : "mean";
        if (op == FoldOp::mean) {
          std::vector<Out> got(len);
          cpu::fold(op, dt, dtype_of<Out>(), got.data(), srcs, m);
          ASSERT_TRUE(same(got, want_mean)) << dtype_name(dt) << " mean n=" << n << " len=" << len;
          continue;
        }
        std::vector<T> got(len);
        cpu::fold(op, dt, dt, got.data(), srcs, m);
        ASSERT_TRUE(same(got, want))
            << dtype_name(dt) << " " << op_name << " n=" << n << " len=" << len;
        // In place: the output over the first source.
        cpu::fold(op, dt, dt, in[0].data(), srcs, m);
        ASSERT_TRUE(same(in[0], want))
            << "in place: " << dtype_name(dt) << " " << op_name << " n=" << n << " len=" << len;
      }
    }
  }
}

TEST(Fold, EverySourceCountMatchesTheScalarModel) {
  check_dtype<float>();
  check_dtype<double>();
  check_dtype<int32_t>();
  check_dtype<int64_t>();
}

}  // namespace
