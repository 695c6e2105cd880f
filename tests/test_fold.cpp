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

// fold_to_streaming (a large psum's slice streamed to every member's output) against the same
// model: every output equal to it, from every start within a 64-byte line (the head before the
// first whole line and the tail after the last go through the cache), with an output over the
// first source; outputs at different phases are refused and left as they were. On a CPU with
// AVX2 the streamed path must run, not fall back.
template <class T>
void check_streamed() {
  std::mt19937_64 rng(3200 + sizeof(T) + std::is_integral_v<T>);
  const DType dt = dtype_of<T>();
  const bool avx2 = cpu::half_fold_path() == cpu::HalfFoldPath::avx2;
  const size_t line = 64 / sizeof(T);
  std::vector<FoldOp> ops = {FoldOp::sum, FoldOp::max, FoldOp::min};
  if (std::is_floating_point_v<T>) ops.push_back(FoldOp::mean);
  for (FoldOp op : ops) {
    for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{8}, size_t{13}}) {
      for (size_t len : {size_t{1}, line - 1, line, line + 1, size_t{1031}}) {
        for (size_t outs : {size_t{1}, size_t{3}, size_t{8}}) {
          for (size_t shift = 0; shift < line; shift += (line > 4 ? 3 : 1)) {
            std::vector<std::vector<T>> in(n, std::vector<T>(len));
            for (auto& v : in)
              for (auto& x : v) x = random_value<T>(rng);
            std::vector<T> want(len);
            for (size_t e = 0; e < len; ++e) {
              T acc = in[0][e];
              for (size_t j = 1; j < n; ++j)
                acc = combine(op == FoldOp::mean ? FoldOp::sum : op, acc, in[j][e]);
              want[e] = op == FoldOp::mean ? static_cast<T>(acc / static_cast<T>(n)) : acc;
            }
            // Outputs `shift` elements past a 64-byte boundary; the last one over source 0.
            std::vector<std::vector<T>> store(outs, std::vector<T>(len + 2 * line));
            std::vector<void*> dsts;
            std::vector<T*> at;
            for (auto& b : store) {
              const auto addr = reinterpret_cast<uintptr_t>(b.data());
              T* p = b.data() + (64 - addr % 64) % 64 / sizeof(T) + shift;
              at.push_back(p);
              dsts.push_back(p);
            }
            std::vector<const void*> srcs;
            std::vector<T> first(len + 2 * line);
            T* f = first.data() +
                   (64 - reinterpret_cast<uintptr_t>(first.data()) % 64) % 64 / sizeof(T) + shift;
            std::copy(in[0].begin(), in[0].end(), f);
            srcs.push_back(f);
            for (size_t j = 1; j < n; ++j) srcs.push_back(in[j].data());
            dsts.back() = f;
            at.back() = f;
            const bool ran =
                cpu::fold_to_streaming(op, dt, dt, dsts, srcs, static_cast<int64_t>(len));
            ASSERT_EQ(ran, avx2) << dtype_name(dt) << " n=" << n << " len=" << len;
            if (!ran) return;
            for (size_t k = 0; k < outs; ++k) {
              ASSERT_TRUE(same(std::vector<T>(at[k], at[k] + len), want))
                  << dtype_name(dt) << " op " << static_cast<int>(op) << " n=" << n
                  << " len=" << len << " output " << k << " of " << outs << " shift " << shift;
            }
            if (outs > 1) {
              // Another phase for one output: refused, nothing written.
              const std::vector<T> before(at[0], at[0] + len);
              std::vector<void*> skewed = dsts;
              skewed[1] = static_cast<T*>(dsts[1]) + 1;
              EXPECT_FALSE(
                  cpu::fold_to_streaming(op, dt, dt, skewed, srcs, static_cast<int64_t>(len)));
              EXPECT_TRUE(same(std::vector<T>(at[0], at[0] + len), before));
            }
          }
        }
      }
    }
  }
}

TEST(Fold, StreamedToEveryOutputMatchesTheScalarModel) {
  check_streamed<float>();
  check_streamed<double>();
  check_streamed<int32_t>();
  check_streamed<int64_t>();
  // What it refuses: an integer pmean.
  std::vector<int32_t> i(64);
  std::vector<float> o(64);
  std::vector<const void*> is = {i.data()};
  std::vector<void*> od = {o.data()};
  EXPECT_FALSE(cpu::fold_to_streaming(FoldOp::mean, DType::i32, DType::f32, od, is, 64));
}

// bfloat16 and float16 streamed: every output has cpu::fold's bits (widened, folded in float32,
// rounded once), for every op, source count and start within a line, with lengths that end in a
// partial tile and a partial line.
TEST(Fold, StreamedHalfMatchesTheFold) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const bool avx2 = cpu::half_fold_path() == cpu::HalfFoldPath::avx2;
    std::mt19937_64 rng(3500);
    auto bits = [&] {
      // Any float's top half: NaNs, infinities, subnormals, every magnitude.
      const float f = random_value<float>(rng);
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      return static_cast<uint16_t>(u >> 16);
    };
    for (FoldOp op : {FoldOp::sum, FoldOp::max, FoldOp::min, FoldOp::mean}) {
      for (size_t n : {size_t{1}, size_t{2}, size_t{5}, size_t{8}, size_t{13}}) {
        for (size_t shift : {size_t{0}, size_t{1}, size_t{17}, size_t{31}}) {
          const size_t len = 5000, outs = 3;
          std::vector<std::vector<uint16_t>> in(n, std::vector<uint16_t>(len));
          for (auto& v : in)
            for (auto& x : v) x = bits();
          std::vector<const void*> srcs;
          for (auto& v : in) srcs.push_back(v.data());
          std::vector<uint16_t> want(len);
          cpu::fold(op, dt, dt, want.data(), srcs, static_cast<int64_t>(len));
          std::vector<std::vector<uint16_t>> store(outs, std::vector<uint16_t>(len + 64));
          std::vector<void*> dsts;
          for (auto& b : store) {
            const auto addr = reinterpret_cast<uintptr_t>(b.data());
            dsts.push_back(b.data() + (64 - addr % 64) % 64 / 2 + shift);
          }
          const bool ran =
              cpu::fold_to_streaming(op, dt, dt, dsts, srcs, static_cast<int64_t>(len));
          ASSERT_EQ(ran, avx2);
          if (!ran) return;
          for (size_t k = 0; k < outs; ++k) {
            const auto* got = static_cast<const uint16_t*>(dsts[k]);
            for (size_t e = 0; e < len; ++e) {
              // Any NaN where the fold has one (the project's rule for arithmetic NaNs).
              auto is_nan = [&](uint16_t b) {
                return (b & 0x7fffu) > (dt == DType::bf16 ? 0x7f80u : 0x7c00u);
              };
              if (is_nan(got[e]) && is_nan(want[e])) continue;
              ASSERT_EQ(got[e], want[e])
                  << dtype_name(dt) << " op " << static_cast<int>(op) << " n=" << n << " shift "
                  << shift << " output " << k << " element " << e;
            }
          }
        }
      }
    }
  }
}

// fold_to at a size that streams (kStreamStoreBytes written) and below it, with and without
// streaming stores: the same bits in every output.
TEST(Fold, FoldToGivesTheSameBitsStreamedOrNot) {
  std::mt19937_64 rng(3300);
  const size_t n = 3, outs = 4;
  const auto len =
      static_cast<size_t>(cpu::kStreamStoreBytes / 4 / static_cast<int64_t>(outs)) + 37;
  std::vector<std::vector<float>> in(n, std::vector<float>(len));
  for (auto& v : in)
    for (auto& x : v) x = random_value<float>(rng);
  std::vector<const void*> srcs;
  for (auto& v : in) srcs.push_back(v.data());
  std::vector<float> want(len);
  cpu::fold(FoldOp::sum, DType::f32, DType::f32, want.data(), srcs, static_cast<int64_t>(len));
  for (bool stream : {false, true}) {
    for (size_t m : {size_t{100}, len}) {
      std::vector<std::vector<float>> out(outs, std::vector<float>(len));
      std::vector<void*> dsts;
      for (auto& v : out) dsts.push_back(v.data());
      cpu::fold_to(FoldOp::sum, DType::f32, DType::f32, dsts, srcs, static_cast<int64_t>(m),
                   stream);
      for (size_t k = 0; k < outs; ++k) {
        ASSERT_TRUE(same(std::vector<float>(out[k].begin(), out[k].begin() + static_cast<long>(m)),
                         std::vector<float>(want.begin(), want.begin() + static_cast<long>(m))))
            << "stream " << stream << " len " << m << " output " << k;
      }
    }
  }
}

// copy_rows_streaming (a large collective copy) against copy_rows: the same bytes in every row,
// for widths around a line, rows pitched or packed, destinations at every offset within a line,
// and nothing written between the rows or past the last one. On a CPU with AVX2 the streamed path
// must run.
TEST(CollCopy, StreamedRowsMatchCopyRows) {
  const bool avx2 = cpu::half_fold_path() == cpu::HalfFoldPath::avx2;
  std::mt19937_64 rng(3400);
  for (size_t width : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{200}, size_t{4099}}) {
    for (size_t height : {size_t{1}, size_t{3}}) {
      for (size_t extra : {size_t{0}, size_t{13}}) {  // dpitch - width
        for (size_t shift : {size_t{0}, size_t{1}, size_t{31}, size_t{63}}) {
          const size_t spitch = width + 7, dpitch = width + extra;
          std::vector<char> src(spitch * height);
          for (auto& c : src) c = static_cast<char>(rng());
          std::vector<char> want(dpitch * height + 128, 'z'), got(want.size() + 64, 'z');
          char* g = got.data() + (64 - reinterpret_cast<uintptr_t>(got.data()) % 64) % 64 + shift;
          cpu::copy_rows(want.data(), dpitch, src.data(), spitch, width, height);
          const bool ran = cpu::copy_rows_streaming(g, dpitch, src.data(), spitch, width, height);
          ASSERT_EQ(ran, avx2);
          if (!ran) return;
          ASSERT_EQ(std::memcmp(g, want.data(), dpitch * height + 64), 0)
              << "width " << width << " height " << height << " dpitch " << dpitch << " shift "
              << shift;
        }
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
