// The cpu platform's 16-bit folds (backends/cpu/coll_primitives.cpp), every code path, against a
// scalar host model: each output widens its inputs to float32 in source order, folds in float32
// and rounds once with core/half.h's conversions. Bits must be equal, over random inputs heavy in
// NaN, Inf, subnormals, rounding ties and float16 overflow, at lengths that end in every tail
// (and span several tiles), for every group size the fold's passes split into.
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backends/cpu/coll_primitives.h"

using namespace meshrt;
using backend::FoldOp;

namespace {

float widen(DType dt, uint16_t b) {
  return dt == DType::bf16 ? static_cast<float>(bfloat16::from_bits(b))
                           : static_cast<float>(float16::from_bits(b));
}
uint16_t narrow(DType dt, float f) {
  return dt == DType::bf16 ? bfloat16(f).bits() : float16(f).bits();
}

bool is_nan(DType dt, uint16_t b) {
  return dt == DType::bf16 ? (b & 0x7fffu) > 0x7f80u : (b & 0x7fffu) > 0x7c00u;
}
// Bits equal; where the model's float32 arithmetic gives a NaN, any NaN (the project's rule for
// arithmetic NaNs: which operand's payload and sign a NaN + NaN keeps depends on the order the
// compiler puts the operands of a commutative add in, in this fold as in its model).
::testing::AssertionResult same(DType dt, uint16_t got, uint16_t want) {
  if (got == want || (is_nan(dt, want) && is_nan(dt, got))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << std::hex << "got 0x" << got << ", want 0x" << want;
}

// The host model of fold(op) for one output element.
uint16_t model(FoldOp op, DType dt, const std::vector<std::vector<uint16_t>>& in, size_t e) {
  float acc = widen(dt, in[0][e]);
  for (size_t j = 1; j < in.size(); ++j) {
    const float v = widen(dt, in[j][e]);
    if (op == FoldOp::max) {
      acc = (acc < v) ? v : acc;
    } else if (op == FoldOp::min) {
      acc = (v < acc) ? v : acc;
    } else {
      acc = acc + v;
    }
  }
  if (op == FoldOp::mean) acc = acc / static_cast<float>(in.size());
  return narrow(dt, acc);
}

// Random 16-bit values: a mix of special values, subnormals, values near the largest finite
// float16 and near 1 (whose sums round on ties), and arbitrary bit patterns.
uint16_t random_value(DType dt, std::mt19937& rng) {
  const uint16_t sign = (rng() & 1u) ? 0x8000u : 0u;
  const bool bf = dt == DType::bf16;
  switch (rng() % 10) {
    case 0:  // zero, Inf, NaN (quiet or signalling, with payloads)
      switch (rng() % 4) {
        case 0:
          return sign;
        case 1:
          return sign | (bf ? 0x7f80u : 0x7c00u);
        default:
          return sign | (bf ? 0x7f80u : 0x7c00u) |
                 static_cast<uint16_t>(1 + rng() % (bf ? 0x7f : 0x3ff));
      }
    case 1:  // subnormal
      return sign | static_cast<uint16_t>(1 + rng() % (bf ? 0x7f : 0x3ff));
    case 2:  // the smallest normals
      return sign | static_cast<uint16_t>((bf ? 0x0080u : 0x0400u) + rng() % 8);
    case 3:  // near the largest finite value (float16: sums overflow to Inf)
      return sign | static_cast<uint16_t>((bf ? 0x7f7fu : 0x7bffu) - rng() % 16);
    case 4:
    case 5:  // near 1 and 256: sums whose low bits are exactly half an ulp
      return sign |
             static_cast<uint16_t>(
                 (rng() & 1 ? (bf ? 0x3f80u : 0x3c00u) : (bf ? 0x4380u : 0x5c00u)) + rng() % 4);
    default:
      return static_cast<uint16_t>(rng());
  }
}

std::vector<cpu::HalfFoldPath> paths() {
  std::vector<cpu::HalfFoldPath> p{cpu::HalfFoldPath::portable};
  if (cpu::half_fold_available(cpu::HalfFoldPath::avx2)) p.push_back(cpu::HalfFoldPath::avx2);
  return p;
}

const char* op_name(FoldOp op) {
  switch (op) {
    case FoldOp::sum:
      return "sum";
    case FoldOp::mean:
      return "mean";
    case FoldOp::max:
      return "max";
    default:
      return "min";
  }
}

// Every path, op and dtype, over source counts that use every pass width (4, 3, 2, 1 inputs)
// and lengths ending in every tail; sources start one element off alignment.
TEST(HalfFold, EveryPathMatchesTheScalarModel) {
  std::mt19937 rng(28);
  const size_t lens[] = {1, 7, 15, 16, 17, 1001, 2047, 2049, 4099};
  const size_t counts[] = {1, 2, 3, 4, 5, 8, 9, 13};
  for (DType dt : {DType::bf16, DType::f16}) {
    for (FoldOp op : {FoldOp::sum, FoldOp::mean, FoldOp::max, FoldOp::min}) {
      for (size_t n : counts) {
        for (size_t len : lens) {
          std::vector<std::vector<uint16_t>> storage(n, std::vector<uint16_t>(len + 1));
          std::vector<std::vector<uint16_t>> in(n, std::vector<uint16_t>(len));
          std::vector<const void*> srcs(n);
          for (size_t j = 0; j < n; ++j) {
            for (size_t e = 0; e < len; ++e) in[j][e] = storage[j][e + 1] = random_value(dt, rng);
            srcs[j] = storage[j].data() + 1;
          }
          std::vector<uint16_t> want(len);
          for (size_t e = 0; e < len; ++e) want[e] = model(op, dt, in, e);
          for (cpu::HalfFoldPath path : paths()) {
            SCOPED_TRACE(::testing::Message()
                         << dtype_name(dt) << " " << op_name(op) << " n=" << n << " len=" << len
                         << " path=" << static_cast<int>(path));
            std::vector<uint16_t> got(len + 1, 0xdeadu);
            cpu::fold_half_with(path, op, dt, got.data(), srcs, static_cast<int64_t>(len));
            for (size_t e = 0; e < len; ++e) {
              ASSERT_TRUE(same(dt, got[e], want[e])) << "element " << e << " of " << len;
            }
            EXPECT_EQ(got[len], 0xdeadu) << "wrote past the end";
          }
          // fold() takes the path this CPU supports; the result is the same.
          std::vector<uint16_t> got(len);
          cpu::fold(op, dt, dt, got.data(), srcs, static_cast<int64_t>(len));
          for (size_t e = 0; e < len; ++e) {
            ASSERT_TRUE(same(dt, got[e], want[e]))
                << dtype_name(dt) << " " << op_name(op) << " n=" << n << " element " << e;
          }
        }
      }
    }
  }
}

// Every 16-bit pattern through each path once (widened and rounded back, no arithmetic: bits
// equal, NaNs come back quiet with their payload's top bits), and every pattern added to its
// neighbour (sums that round on ties, overflow, subnormals).
TEST(HalfFold, EveryBitPattern) {
  for (DType dt : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> all(65536), next(65536);
    for (size_t i = 0; i < all.size(); ++i) {
      all[i] = static_cast<uint16_t>(i);
      next[i] = static_cast<uint16_t>(i + 1);
    }
    for (cpu::HalfFoldPath path : paths()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " path=" << static_cast<int>(path));
      std::vector<uint16_t> got(all.size());
      cpu::fold_half_with(path, FoldOp::sum, dt, got.data(), {all.data()}, 65536);
      for (size_t i = 0; i < all.size(); ++i)
        ASSERT_EQ(got[i], narrow(dt, widen(dt, all[i]))) << "bits " << i;
      cpu::fold_half_with(path, FoldOp::sum, dt, got.data(), {all.data(), next.data()}, 65536);
      for (size_t i = 0; i < all.size(); ++i) {
        ASSERT_TRUE(same(dt, got[i], narrow(dt, widen(dt, all[i]) + widen(dt, next[i]))))
            << "bits " << i;
      }
      // A mean over three inputs divides by 3: outputs with every mantissa bit set.
      cpu::fold_half_with(path, FoldOp::mean, dt, got.data(), {all.data(), next.data(), all.data()},
                          65536);
      for (size_t i = 0; i < all.size(); ++i) {
        const float s = widen(dt, all[i]) + widen(dt, next[i]) + widen(dt, all[i]);
        ASSERT_TRUE(same(dt, got[i], narrow(dt, s / 3.0f))) << "bits " << i;
      }
    }
  }
}

// The output may be one of the sources (a fold in place).
TEST(HalfFold, OutputAliasesASource) {
  std::mt19937 rng(31);
  for (DType dt : {DType::bf16, DType::f16}) {
    for (cpu::HalfFoldPath path : paths()) {
      const size_t len = 5000, n = 6;
      std::vector<std::vector<uint16_t>> in(n, std::vector<uint16_t>(len));
      for (auto& v : in)
        for (auto& x : v) x = random_value(dt, rng);
      std::vector<uint16_t> want(len);
      for (size_t e = 0; e < len; ++e) want[e] = model(FoldOp::sum, dt, in, e);
      std::vector<const void*> srcs;
      for (auto& v : in) srcs.push_back(v.data());
      cpu::fold_half_with(path, FoldOp::sum, dt, in[0].data(), srcs, static_cast<int64_t>(len));
      for (size_t e = 0; e < len; ++e) {
        ASSERT_TRUE(same(dt, in[0][e], want[e]))
            << dtype_name(dt) << " path=" << static_cast<int>(path) << " element " << e;
      }
    }
  }
}

// pmean's last step after a 16-bit sum (ring, across processes): divided in float, rounded once.
TEST(HalfFold, MeanFromSum) {
  for (DType dt : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> all(65536), got(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    for (int64_t divisor : {1, 3, 8, 7}) {
      cpu::mean_from_sum(dt, dt, got.data(), all.data(), 65536, divisor);
      for (size_t i = 0; i < all.size(); ++i) {
        ASSERT_TRUE(same(dt, got[i], narrow(dt, widen(dt, all[i]) / static_cast<float>(divisor))))
            << dtype_name(dt) << " bits " << i << " / " << divisor;
      }
    }
  }
}

}  // namespace
