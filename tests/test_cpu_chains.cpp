// The cpu platform's elementwise chains (Backend::elementwise_chain: backends/cpu/kernels.cpp) run
// a tile at a time; these random chains check that against the default, the ops one after the
// other over the whole shape, bit for bit (ranks 0-4, empty, unit, odd and tile-edge dims,
// transposed, broadcast and negative strides, bool intermediates, constants, several outputs,
// NaN), and in place. And the kernels' wide (AVX2) dense loops against the scalar operations.
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/kernels.h"
#include "backends/scalar_ops.h"
#include "runtime/detail/platform.h"

using namespace meshrt;
using backend::BinaryOp;
using backend::ChainOp;
using backend::ElementwiseChain;
using backend::Strided;
using backend::UnaryOp;

namespace {

struct Input {
  std::vector<char> buf;
  Strided s;
};

Input make_input(std::mt19937& rng, const std::vector<int64_t>& shape, DType t, bool dense) {
  const size_t rank = shape.size();
  std::vector<size_t> perm(rank);
  for (size_t i = 0; i < rank; ++i) perm[i] = i;
  if (!dense) std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> st(rank, 0);
  std::vector<bool> bc(rank, false), neg(rank, false);
  int64_t stride = 1;
  for (size_t k = rank; k-- > 0;) {
    const size_t d = perm[k];
    if (!dense && rng() % 4 == 0) {
      bc[d] = true;
      continue;
    }
    neg[d] = !dense && rng() % 4 == 0;
    st[d] = neg[d] ? -stride : stride;
    stride *= shape[d];
  }
  const size_t es = dtype_size(t);
  Input in;
  in.buf.resize(static_cast<size_t>(std::max<int64_t>(stride, 1)) * es + 16);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (size_t i = 0; i * es < in.buf.size() - 16; ++i) {
    if (t == DType::f32) {
      float v = u(rng);
      if (rng() % 50 == 0) v = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(in.buf.data() + i * es, &v, 4);
    } else if (t == DType::bool_) {
      in.buf[i] = static_cast<char>(rng() % 2);
    }
  }
  int64_t off = 0;
  for (size_t d = 0; d < rank; ++d) {
    if (neg[d]) off += (shape[d] - 1) * (-st[d]);
  }
  in.s = Strided{in.buf.data() + off * static_cast<int64_t>(es), st};
  return in;
}

// One op of a float32 chain, reading values x (and y); comparisons write bool.
ChainOp un(UnaryOp op, int x) {
  ChainOp o;
  o.kind = ChainOp::Kind::unary;
  o.op = static_cast<int>(op);
  o.src[0] = x;
  return o;
}
ChainOp bin(BinaryOp op, int x, int y) {
  ChainOp o;
  o.kind = ChainOp::Kind::binary;
  o.op = static_cast<int>(op);
  o.out = backend::is_comparison(op) ? DType::bool_ : DType::f32;
  o.src[0] = x;
  o.src[1] = y;
  return o;
}

}  // namespace

TEST(CpuChains, TilesMatchTheKernelsOneAfterTheOther) {
  backend::Backend& be = detail::backend_of(devices()[0]);
  std::mt19937 rng(1234);
  const std::vector<int64_t> dims = {0,  1,  1,   2,    3,    5,    7,    31,
                                     64, 65, 129, 1000, 4095, 4096, 4097, 9000};
  int ran = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    const size_t rank = rng() % 5;
    std::vector<int64_t> shape;
    int64_t n = 1, span = 1;  // span: the inputs' extent, zero dims counted as one
    for (size_t d = 0; d < rank; ++d) {
      int64_t v = dims[rng() % dims.size()];
      if (span * std::max<int64_t>(v, 1) > 300000) v = 1 + static_cast<int64_t>(rng() % 3);
      shape.push_back(v);
      n *= v;
      span *= std::max<int64_t>(v, 1);
    }
    ElementwiseChain c;
    const int nf = 1 + static_cast<int>(rng() % 3);
    const bool has_bool = rng() % 2 == 0;
    c.inputs = nf + (has_bool ? 1 : 0);
    for (int i = 0; i < nf; ++i) c.input_dtypes.push_back(DType::f32);
    if (has_bool) c.input_dtypes.push_back(DType::bool_);
    const int nops = 1 + static_cast<int>(rng() % 8);
    auto pick = [&](DType t) {
      std::vector<int> vs;
      for (int v = 0; v < c.inputs + static_cast<int>(c.ops.size()); ++v) {
        if (c.value_dtype(v) == t) vs.push_back(v);
      }
      return vs.empty() ? -1 : vs[rng() % vs.size()];
    };
    // Scalars held as constants (jit's literals), read broadcast like any value.
    for (int k = static_cast<int>(rng() % 3); k > 0; --k) {
      ChainOp o;
      o.kind = ChainOp::Kind::constant;
      o.value = rng() % 10 == 0 ? std::numeric_limits<double>::quiet_NaN()
                                : static_cast<double>(static_cast<int>(rng() % 2001) - 1000) / 7.0;
      c.ops.push_back(o);
    }
    for (int i = 0; i < nops; ++i) {
      ChainOp o;
      const int kind = static_cast<int>(rng() % 5);
      // Prefer reading the newest value so intermediates are used.
      const int newest = c.inputs + static_cast<int>(c.ops.size()) - 1;
      auto f32 = [&] {
        return (rng() % 2 == 0 && c.value_dtype(newest) == DType::f32) ? newest : pick(DType::f32);
      };
      if (kind == 0) {
        o.kind = ChainOp::Kind::unary;
        const UnaryOp ops[] = {UnaryOp::neg, UnaryOp::exp, UnaryOp::tanh, UnaryOp::sqrt,
                               UnaryOp::relu};
        o.op = static_cast<int>(ops[rng() % 5]);
        o.src[0] = f32();
      } else if (kind == 1 || kind == 2) {
        o.kind = ChainOp::Kind::binary;
        const BinaryOp ops[] = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div,
                                BinaryOp::max};
        o.op = static_cast<int>(ops[rng() % 5]);
        o.src[0] = f32();
        o.src[1] = pick(DType::f32);
      } else if (kind == 3) {
        o.kind = ChainOp::Kind::binary;
        o.op = static_cast<int>(BinaryOp::lt);
        o.out = DType::bool_;
        o.src[0] = f32();
        o.src[1] = pick(DType::f32);
        if (i + 1 == nops) o.out = DType::bool_;
      } else {
        const int cond = pick(DType::bool_);
        if (cond < 0) {
          o.kind = ChainOp::Kind::unary;
          o.op = static_cast<int>(UnaryOp::neg);
          o.src[0] = f32();
        } else {
          o.kind = ChainOp::Kind::select;
          o.src[0] = cond;
          o.src[1] = f32();
          o.src[2] = pick(DType::f32);
        }
      }
      c.ops.push_back(o);
    }
    std::vector<Input> ins;
    std::vector<Strided> ss;
    for (int i = 0; i < c.inputs; ++i) {
      ins.push_back(make_input(rng, shape, c.input_dtypes[static_cast<size_t>(i)], rng() % 3 == 0));
    }
    for (auto& i : ins) ss.push_back(i.s);
    // Some chains write earlier results too (multi-output chains: adam's m and v).
    const int all = static_cast<int>(c.ops.size());
    if (nops > 1 && rng() % 2 == 0) {
      for (int i = 0; i + 1 < all; ++i) {
        if (c.ops[static_cast<size_t>(i)].kind != ChainOp::Kind::constant && rng() % 3 == 0) {
          c.outputs.push_back(c.inputs + i);
        }
      }
      if (!c.outputs.empty()) c.outputs.push_back(c.inputs + all - 1);
    }
    std::vector<std::vector<char>> want, got;
    std::vector<void*> wp, gp;
    for (size_t k = 0; k < c.output_count(); ++k) {
      const size_t ob = static_cast<size_t>(n) * dtype_size(c.value_dtype(c.output(k)));
      want.emplace_back(ob + 1, 0x5a);
      got.emplace_back(ob + 1, 0x5b);
      wp.push_back(want.back().data());
      gp.push_back(got.back().data());
    }
    be.Backend::elementwise_chain(0, c, shape, ss, wp);
    be.elementwise_chain(0, c, shape, ss, gp);
    ++ran;
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(0, std::memcmp(want[k].data(), got[k].data(), want[k].size() - 1))
          << "iter " << iter << " rank " << rank << " output " << k;
      ASSERT_EQ(got[k].back(), 0x5b) << "written past output " << k;
    }
  }
  EXPECT_GT(ran, 0);
}

// In place: an output is input 0's memory (read densely), as jit's donation allows: the last
// output, or an earlier one of a chain with two outputs.
TEST(CpuChains, InPlaceMatchesOutOfPlace) {
  backend::Backend& be = detail::backend_of(devices()[0]);
  std::mt19937 rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<int64_t> shape = {static_cast<int64_t>(1 + rng() % 70),
                                  static_cast<int64_t>(1 + rng() % 9000)};
    ElementwiseChain c;
    c.inputs = 2;
    c.input_dtypes = {DType::f32, DType::f32};
    // v2 = x0 * x1; v3 = exp(v2); v4 = v3 - x0; v5 = x0 < v4; v6 = select(v5, x0, v4)
    ChainOp f;
    f.kind = ChainOp::Kind::select;
    f.src[0] = 5;
    f.src[1] = 0;
    f.src[2] = 4;
    c.ops = {bin(BinaryOp::mul, 0, 1), un(UnaryOp::exp, 2), bin(BinaryOp::sub, 3, 0),
             bin(BinaryOp::lt, 0, 4), f};
    Input x0 = make_input(rng, shape, DType::f32, true);
    Input x1 = make_input(rng, shape, DType::f32, rng() % 2 == 0);
    const int64_t n = shape[0] * shape[1];
    std::vector<char> want(static_cast<size_t>(n) * 4);
    std::vector<Strided> ss = {x0.s, x1.s};
    const bool two = iter % 2 == 1;  // and v3 (exp) written too, in place of x0 or of x1
    std::vector<char> want3(want.size()), got3(want.size());
    if (two) c.outputs = {3, 6};
    void* const x0p = const_cast<void*>(x0.s.data);
    std::vector<void*> wp = {want.data()}, gp = {x0p};
    if (two) {
      wp = {want3.data(), want.data()};
      // Odd iterations up to 150: v6 over x0; after: v3 over x0, v6 elsewhere.
      gp = iter < 150 ? std::vector<void*>{got3.data(), x0p} : std::vector<void*>{x0p, got3.data()};
    }
    be.Backend::elementwise_chain(0, c, shape, ss, wp);
    be.elementwise_chain(0, c, shape, ss, gp);
    if (!two || iter < 150) {
      ASSERT_EQ(0, std::memcmp(want.data(), x0.s.data, want.size())) << iter;
      if (two) ASSERT_EQ(0, std::memcmp(want3.data(), got3.data(), want.size())) << iter;
    } else {
      ASSERT_EQ(0, std::memcmp(want3.data(), x0.s.data, want.size())) << iter;
      ASSERT_EQ(0, std::memcmp(want.data(), got3.data(), want.size())) << iter;
    }
  }
}

// The cpu's dense elementwise loops run 32 bytes wide on CPUs with AVX2 and 16 on the rest; every
// element must still be the scalar operation's (IEEE arithmetic, NaN-propagating max/min, a
// square root without errno): float32 and float64 over dense and broadcast operands, lengths
// with vector tails, subnormals, signed zeros, infinities and NaN (NaN compared as NaN).
TEST(CpuKernels, WideLoopsGiveTheScalarBits) {
  namespace sc = backend::scalar;
  std::mt19937 rng(7);
  auto sample = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    const float special[] = {0.0f,
                             -0.0f,
                             1e-40f,
                             -3e-39f,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(),
                             3.4e38f,
                             -1.0f};
    std::uniform_real_distribution<float> u(-100.0f, 100.0f);
    for (float& x : v) x = rng() % 8 == 0 ? special[rng() % 9] : u(rng);
    return v;
  };
  auto same = [](float want, float got) {
    return std::isnan(want) ? std::isnan(got) : std::memcmp(&want, &got, sizeof want) == 0;
  };
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{1000}, int64_t{4099}}) {
    const std::vector<float> a = sample(n), b = sample(n);
    const std::vector<int64_t> shape{n};
    for (int layout = 0; layout < 3; ++layout) {  // dense, b a scalar, a a scalar
      const Strided sa{a.data(), {layout == 2 ? 0 : 1}}, sb{b.data(), {layout == 1 ? 0 : 1}};
      for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::max,
                          BinaryOp::min}) {
        std::vector<float> got(static_cast<size_t>(n));
        cpu::binary(op, DType::f32, DType::f32, shape, sa, sb, got.data());
        for (int64_t i = 0; i < n; ++i) {
          const float x = a[static_cast<size_t>(layout == 2 ? 0 : i)];
          const float y = b[static_cast<size_t>(layout == 1 ? 0 : i)];
          const float want = op == BinaryOp::add   ? x + y
                             : op == BinaryOp::sub ? x - y
                             : op == BinaryOp::mul ? x * y
                             : op == BinaryOp::div ? x / y
                             : op == BinaryOp::max ? sc::max_nan(x, y)
                                                   : sc::min_nan(x, y);
          ASSERT_TRUE(same(want, got[static_cast<size_t>(i)]))
              << "op " << static_cast<int>(op) << " layout " << layout << " n " << n << " at " << i
              << ": " << x << ", " << y << " -> " << got[static_cast<size_t>(i)] << " want "
              << want;
        }
      }
    }
    for (UnaryOp op : {UnaryOp::sqrt, UnaryOp::neg, UnaryOp::relu}) {
      std::vector<float> got(static_cast<size_t>(n));
      cpu::unary(op, DType::f32, DType::f32, shape, Strided{a.data(), {1}}, got.data());
      for (int64_t i = 0; i < n; ++i) {
        const float x = a[static_cast<size_t>(i)];
        const float want = sc::unary(static_cast<int>(op), x);
        ASSERT_TRUE(same(want, got[static_cast<size_t>(i)]))
            << "unary " << static_cast<int>(op) << " n " << n << " at " << i << ": " << x;
      }
    }
    // float64 through the same loops.
    std::vector<double> da(a.begin(), a.end()), db(b.begin(), b.end()), dg(static_cast<size_t>(n));
    cpu::binary(BinaryOp::div, DType::f64, DType::f64, shape, Strided{da.data(), {1}},
                Strided{db.data(), {1}}, dg.data());
    for (int64_t i = 0; i < n; ++i) {
      const double want = da[static_cast<size_t>(i)] / db[static_cast<size_t>(i)];
      const double got = dg[static_cast<size_t>(i)];
      ASSERT_TRUE(std::isnan(want) ? std::isnan(got) : std::memcmp(&want, &got, 8) == 0) << i;
    }
  }
}

// Outputs must be op results other than a constant's, the last output the last op's: the cpu
// refuses other chains (jit never fuses them) and the default says what is wrong.
TEST(CpuChains, RefusesOutputsThatAreNotOpsResults) {
  backend::Backend& be = detail::backend_of(devices()[0]);
  ElementwiseChain c;
  c.inputs = 1;
  c.input_dtypes = {DType::f32};
  ChainOp k;
  k.kind = ChainOp::Kind::constant;
  k.value = 2.0;
  c.ops = {k, bin(BinaryOp::mul, 0, 1), un(UnaryOp::neg, 2)};  // 0 x, 1 2.0, 2 x * 2, 3 -(x * 2)
  EXPECT_TRUE(be.fuses_chain(c));
  c.outputs = {2, 3};
  EXPECT_TRUE(be.fuses_chain(c));
  std::vector<float> x(10, 1.5f), y2(10), y3(10);
  const std::vector<Strided> in = {Strided{x.data(), {1}}};
  be.elementwise_chain(0, c, {10}, in, std::vector<void*>{y2.data(), y3.data()});
  EXPECT_EQ(y2, std::vector<float>(10, 3.0f));
  EXPECT_EQ(y3, std::vector<float>(10, -3.0f));
  for (const std::vector<int>& bad :
       std::vector<std::vector<int>>{{0, 3}, {1, 3}, {3, 2}, {2, 4}}) {
    c.outputs = bad;
    EXPECT_FALSE(be.fuses_chain(c)) << bad[0] << " " << bad[1];
    EXPECT_THROW(
        be.Backend::elementwise_chain(0, c, {10}, in, std::vector<void*>{y2.data(), y3.data()}),
        Error)
        << bad[0] << " " << bad[1];
  }
}
