// jit: trace once per signature, replay bit for bit, errors, lower().as_text()/as_dot().
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "runtime/detail/access.h"
#include "tests/test_util.h"

using namespace meshrt;

namespace {

Mesh mesh8() { return make_mesh({8}, {"x"}); }
Mesh mesh42() { return make_mesh({4, 2}, {"x", "y"}); }

std::vector<float> iota(int64_t n, float scale = 0.25f, float offset = -3.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = offset + scale * static_cast<float>(i % 29);
  return v;
}

Array put(const std::vector<float>& v, Shape shape, const Sharding& s) {
  return device_put(v, std::move(shape), s);
}

using test::expect_same;  // Arrays: dtype, shape, sharding, pending sums and bits

Array abs_like(const Array& x) { return sqrt(x * x); }

Array program20(const Array& x, const Array& y) {
  Array a = 2.0 * sin(x) + 1.0;
  Array b = a * y - exp(y * 0.1);
  Array c = maximum(b, a) / (1.0 + abs_like(b));
  Array s = sum(c, 0);
  Array m = mean(c * c, 1);
  Array t = tanh(c) + s;
  Array u = t - max(t, 1, true);
  return u * 0.5 + m[0];
}

TEST(Jit, ReplayIsBitIdenticalToEager) {
  Mesh m = mesh8();
  NamedSharding sx(m, P("x"));
  auto f = [](const Array& x, const Array& y) { return program20(x, y); };
  auto step = jit(f);
  for (int round = 0; round < 3; ++round) {
    Array x = put(iota(64 * 16, 0.125f + 0.01f * round), {64, 16}, sx);
    Array y = put(iota(64 * 16, -0.5f, 2.0f + round), {64, 16}, sx);
    Array want = f(x, y);
    Array got = step(x, y);
    expect_same(got, want);
  }
  EXPECT_EQ(step.trace_count(), 1u);
}

// jit folds a small psum from the caller's thread only where the host reads device memory (cpu);
// on a device platform the psum runs as the collective. Everything else about compiled steps
// (recorded kernels, planned buffers, in-place donation) holds on every platform.
bool host_folds_psums() { return default_platform() == "cpu"; }

// The replay's compiled steps: program20's device-local steps run as their recorded kernels with
// intermediates in planned buffers, its psum is folded from the caller's thread; every call gives
// eager's bits, and later calls (reusing the buffers) leave earlier results alone.
TEST(Jit, CompiledStepsMatchEagerAndLaterCallsKeepEarlierResults) {
  Mesh m = mesh8();
  NamedSharding sx(m, P("x"));
  auto f = [](const Array& x, const Array& y) { return program20(x, y); };
  auto step = jit(f);
  std::vector<Array> got, want;
  for (int round = 0; round < 4; ++round) {
    Array x = put(iota(64 * 16, 0.1f + 0.02f * round), {64, 16}, sx);
    Array y = put(iota(64 * 16, -0.5f, 1.0f + round), {64, 16}, sx);
    want.push_back(f(x, y));
    got.push_back(step(x, y));
  }
  for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], want[i]);
  Array x = put(iota(64 * 16), {64, 16}, sx);
  const std::string text = step.lower(x, x).as_text();
  // Fused (cpu, and cuda under MESHRT_CUDA_FUSION=chains): the 22 device-local steps, merged
  // where one reads the result of the one before, are 9, 3 of them an elementwise chain (16
  // kernels in all, each writing one value: %0 to %11 with %2 and %6 read twice inside it, tanh
  // and add, the last two); eager's bits all the same (above).
  const bool chains = text.find("elementwise chains") != std::string::npos;
  if (default_platform() == "cpu") EXPECT_TRUE(chains) << text;
  if (chains) {
    EXPECT_NE(text.find("compiled: 9 device-local steps"), std::string::npos) << text;
    EXPECT_NE(text.find("fused: 3 elementwise chains of 16 kernels in all, writing 3 values"),
              std::string::npos)
        << text;
  } else {
    EXPECT_NE(text.find("compiled: 22 device-local steps"), std::string::npos) << text;
  }
  {
    setenv("MESHRT_JIT_FUSION", "0", 1);
    const std::string unfused = jit(f).lower(x, x).as_text();
    unsetenv("MESHRT_JIT_FUSION");
    EXPECT_NE(unfused.find("compiled: 22 device-local steps"), std::string::npos) << unfused;
    EXPECT_EQ(unfused.find("fused:"), std::string::npos) << unfused;
  }
  EXPECT_NE(text.find("planned buffers per device"), std::string::npos) << text;
  if (host_folds_psums()) {
    EXPECT_NE(text.find("1 small psums folded from the caller's thread"), std::string::npos)
        << text;
  }
  // m[0] is a view of its operand's block: that step runs as recorded, and the text says why.
  EXPECT_NE(text.find("not compiled: 1 step (a result that views an operand)"), std::string::npos)
      << text;
}

// A psum over one axis of a 2-D mesh, folded by the replay per group: the same bits as the
// collective the eager op runs.
TEST(Jit, FoldedPsumOverOneAxisOfTwoMatchesEager) {
  Mesh m = mesh42();
  auto f = [](const Array& z) { return exp(sum(sin(z), 1) * 0.5); };
  auto step = jit(f);
  for (int round = 0; round < 3; ++round) {
    Array z = put(iota(8 * 4, 0.3f + round, -1.0f), {8, 4}, NamedSharding(m, P("x", "y")));
    expect_same(step(z), f(z));
    Array zi = put(iota(8 * 4, 0.5f, round - 7.0f), {8, 4}, NamedSharding(m, P("y", "x")));
    expect_same(step(zi), f(zi));
  }
  Array z = put(iota(8 * 4), {8, 4}, NamedSharding(m, P("x", "y")));
  if (!host_folds_psums()) {
    GTEST_SKIP() << "small psums are folded from the caller's thread only on cpu (host memory); "
                    "values checked above";
  }
  EXPECT_NE(step.lower(z).as_text().find("1 small psums folded"), std::string::npos);
}

// The same Array passed twice at trace time, then two different ones with the same signature:
// the program keeps the arguments apart (the trace runs on copies of the arguments).
TEST(Jit, AnArgumentRepeatedAtTraceTimeIsKeptApart) {
  Mesh m = mesh8();
  NamedSharding sx(m, P("x"));
  auto f = [](const Array& x, const Array& y) { return x * 2.0 + sin(y); };
  auto step = jit(f);
  Array x = put(iota(64 * 4), {64, 4}, sx);
  expect_same(step(x, x), f(x, x));
  Array x2 = put(iota(64 * 4, 0.5f), {64, 4}, sx);
  Array y2 = put(iota(64 * 4, -1.5f, 7.0f), {64, 4}, sx);
  expect_same(step(x2, y2), f(x2, y2));
  expect_same(step(y2, y2), f(y2, y2));
  EXPECT_EQ(step.trace_count(), 1u);
}

// An Array the function captures (a constant of the program) that is also passed as the argument
// at trace time: a later call with another argument still reads the captured Array.
TEST(Jit, ACapturedArrayPassedAlsoAsTheArgumentStaysAConstant) {
  Mesh m = mesh8();
  NamedSharding sx(m, P("x"));
  Array c = put(iota(64 * 4, 0.75f), {64, 4}, sx);
  auto f = [c](const Array& x) { return x * 3.0 - c; };
  auto step = jit(f);
  expect_same(step(c), f(c));
  Array x2 = put(iota(64 * 4, -0.5f, 2.0f), {64, 4}, sx);
  expect_same(step(x2), f(x2));
  EXPECT_EQ(step.trace_count(), 1u);
}

// Calls from several threads at once each take their own working memory.
TEST(Jit, ConcurrentCallsGiveEachCallersResults) {
  Mesh m = mesh8();
  NamedSharding sx(m, P("x"));
  auto f = [](const Array& x, const Array& y) { return program20(x, y); };
  auto step = jit(f);
  constexpr int kThreads = 3, kCalls = 12;
  std::vector<Array> xs, want;
  for (int i = 0; i < kThreads * kCalls; ++i) {
    xs.push_back(put(iota(32 * 8, 0.05f * (i + 1), -1.0f), {32, 8}, sx));
    want.push_back(f(xs.back(), xs.back()));
  }
  (void)step(xs[0], xs[0]);  // traced once, before the threads start
  std::vector<Array> got(xs.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int c = 0; c < kCalls; ++c) {
        const size_t i = static_cast<size_t>(t * kCalls + c);
        got[i] = step(xs[i], xs[i]);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], want[i]);
  EXPECT_EQ(step.trace_count(), 1u);
}

TEST(Jit, RetracesOnANewSignature) {
  Mesh m = mesh8();
  auto f = [](const Array& x) { return sum(x * 3.0, 0); };
  auto step = jit(f);
  Array a = put(iota(64), {8, 8}, NamedSharding(m, P("x")));
  Array b = put(iota(64), {8, 8}, NamedSharding(m, P(None, "x")));
  Array c = put(iota(128), {16, 8}, NamedSharding(m, P("x")));
  expect_same(step(a), f(a));
  expect_same(step(b), f(b));
  expect_same(step(c), f(c));
  expect_same(step(a), f(a));
  Array d = device_put(a, NamedSharding(m, P("x"))).block_until_ready();
  expect_same(step(astype(d, DType::f64)), f(astype(d, DType::f64)));
  EXPECT_EQ(step.trace_count(), 4u);
}

TEST(Jit, PendingSumsAndCollectivesReplay) {
  Mesh m = mesh42();
  auto f = [&](const Array& x, const Array& w) {
    Array h = matmul(x, w);  // contraction sharded over y: pending
    Array s = with_sharding_constraint(sum(h, 0), NamedSharding(m, P("x")));
    return std::vector<Array>{relu(h), s, max(h, 0), h};
  };
  auto step = jit(f);
  for (int round = 0; round < 2; ++round) {
    Array x = put(iota(16 * 8, 0.5f, round - 2.0f), {16, 8}, NamedSharding(m, P("x", "y")));
    Array w = put(iota(8 * 16, -0.25f, 1.0f + round), {8, 16}, NamedSharding(m, P("y")));
    std::vector<Array> want = f(x, w);
    std::vector<Array> got = step(x, w);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], want[i]);
  }
}

struct Params {
  Array w, b;
  std::vector<Array> extra;
};
MESHRT_TREE(Params, w, b, extra);

TEST(Jit, TreesInAndOut) {
  Mesh m = mesh8();
  NamedSharding rep(m, P());
  NamedSharding dp(m, P("x"));
  auto f = [](const Params& p, const Array& x) {
    Array h = matmul(x, p.w) + p.b;
    for (const Array& e : p.extra) h = h * e;
    return std::make_pair(sum(h * h), p);
  };
  auto step = jit(f);
  Params p{put(iota(4 * 4), {4, 4}, rep), put(iota(4), {4}, rep), {put(iota(4, 0.1f), {4}, rep)}};
  for (int round = 0; round < 2; ++round) {
    Array x = put(iota(16 * 4, 0.3f, -1.0f * round), {16, 4}, dp);
    auto want = f(p, x);
    auto got = step(p, x);
    expect_same(got.first, want.first);
    expect_same(got.second.w, p.w);
  }
  p.extra.push_back(put(iota(4, 0.2f), {4}, rep));  // a new structure: traced again
  Array x = put(iota(16 * 4), {16, 4}, dp);
  expect_same(step(p, x).first, f(p, x).first);
  EXPECT_EQ(step.trace_count(), 2u);
}

TEST(Jit, StaticArgumentsRetrace) {
  Mesh m = mesh8();
  auto f = [](const Array& x, int k) { return x * static_cast<double>(k); };
  auto step = jit(f);
  Array x = put(iota(8), {8}, NamedSharding(m, P("x")));
  expect_same(step(x, 2), f(x, 2));
  expect_same(step(x, 3), f(x, 3));
  expect_same(step(x, 2), f(x, 2));
  EXPECT_EQ(step.trace_count(), 2u);
}

TEST(Jit, ValueAndGradInsideJit) {
  Mesh m = mesh8();
  NamedSharding rep(m, P());
  NamedSharding dp(m, P("x"));
  auto loss = [](const Params& p, const Array& x, const Array& y) {
    Array h = tanh(matmul(x, p.w) + p.b);
    return mean((h - y) * (h - y));
  };
  auto vg = value_and_grad(loss);
  auto step = jit([vg](const Params& p, const Array& x, const Array& y) { return vg(p, x, y); });
  Params p{put(iota(4 * 4, 0.1f, -0.5f), {4, 4}, rep), put(iota(4, 0.05f), {4}, rep), {}};
  for (int round = 0; round < 3; ++round) {
    Array x = put(iota(16 * 4, 0.3f, -1.0f + round), {16, 4}, dp);
    Array y = put(iota(16 * 4, 0.1f, 0.5f * round), {16, 4}, dp);
    auto want = vg(p, x, y);
    auto got = step(p, x, y);
    expect_same(std::get<0>(got), std::get<0>(want));
    expect_same(std::get<1>(got).w, std::get<1>(want).w);
    expect_same(std::get<1>(got).b, std::get<1>(want).b);
    // One SGD step, as a training loop would.
    p.w = p.w - 0.1 * std::get<1>(got).w;
  }
  EXPECT_EQ(step.trace_count(), 1u);
}

TEST(Jit, InAndOutShardings) {
  Mesh m = mesh8();
  auto f = [](const Array& x) { return 2.0 * x; };
  auto step = jit(
      f, {.in_shardings = {NamedSharding(m, P("x"))}, .out_shardings = {NamedSharding(m, P())}});
  Array x = put(iota(16), {16}, NamedSharding(m, P()));
  Array got = step(x);
  EXPECT_TRUE(got.sharding() == NamedSharding(m, P()));
  EXPECT_EQ(got.to_vector<float>(), (2.0 * x).to_vector<float>());
  Array again = step(x);
  expect_same(again, got);

  Mesh other = make_mesh({4}, {"x"}, std::vector<Device>(devices().begin(), devices().begin() + 4));
  auto bad = jit(f, {.in_shardings = {NamedSharding(other, P("x"))}});
  EXPECT_MESHRT_ERROR(bad(x), "[jit] in_shardings[0]");
}

TEST(Jit, Donation) {
  Mesh m = mesh8();
  auto f = [](const Array& w, const Array& g) { return w - 0.5 * g; };
  auto step = jit(f, {.donate_argnums = {0}});
  Array w = put(iota(64), {64}, NamedSharding(m, P("x")));
  Array g = put(iota(64, 0.5f), {64}, NamedSharding(m, P("x")));
  Array want = f(w, g);
  Array w1 = step(w, g);
  expect_same(w1, want);
  EXPECT_TRUE(detail::ArrayAccess::blocks(w).empty());  // deleted, as JAX deletes donated buffers
  Array w2 = step(w1, g);
  expect_same(w2, f(want, g));
  const Array cw = w2;
  EXPECT_MESHRT_ERROR(step(cw, g), "donate_argnums");
}

std::vector<const void*> block_addresses(const Array& a) {
  std::vector<const void*> v;
  for (const Tensor& t : detail::ArrayAccess::blocks(a)) v.push_back(t.data());
  return v;
}

TEST(Jit, DonationWritesTheUpdateIntoTheDonatedBuffers) {
  Mesh m = mesh8();
  auto f = [](const Array& w, const Array& g) { return w - 0.5 * sin(g); };
  auto step = jit(f, {.donate_argnums = {0}});
  const Array g = put(iota(4096, 0.25f), {64, 64}, NamedSharding(m, P("x")));
  Array w = put(iota(4096), {64, 64}, NamedSharding(m, P("x")));
  Array want = f(w, g);
  Array w1 = step(w, g);  // the trace (eager)
  expect_same(w1, want);
  EXPECT_NE(step.lower(w1, g).as_text().find("in place: 1 compiled step writes"), std::string::npos)
      << step.lower(w1, g).as_text();
  for (int i = 0; i < 3; ++i) {
    want = f(w1, g);
    const std::vector<const void*> at = block_addresses(w1);
    Array w2 = step(w1, g);
    expect_same(w2, want);
    EXPECT_EQ(block_addresses(w2), at) << "call " << i << ": the result is not in w1's buffers";
    EXPECT_TRUE(detail::ArrayAccess::blocks(w1).empty());
    w1 = w2;
  }
  // A copy of the donated Array kept elsewhere still holds the buffers: the call leaves them
  // alone (the copy keeps its values) and writes the result elsewhere.
  const Array kept = w1;
  const std::vector<float> kept_values = kept.to_vector<float>();
  want = f(w1, g);
  Array w3 = step(w1, g);
  expect_same(w3, want);
  EXPECT_EQ(kept.to_vector<float>(), kept_values);
  EXPECT_NE(block_addresses(w3), block_addresses(kept));
  // Not donated: never in place.
  auto plain = jit(f);
  Array v = put(iota(4096), {64, 64}, NamedSharding(m, P("x")));
  (void)plain(v, g);
  const std::vector<float> v_values = v.to_vector<float>();
  Array v1 = plain(v, g);
  EXPECT_EQ(v.to_vector<float>(), v_values);
  // ... and its text promises nothing in place (the same program, without donation).
  EXPECT_EQ(plain.lower(v, g).as_text().find("in place"), std::string::npos)
      << plain.lower(v, g).as_text();
  EXPECT_NE(block_addresses(v1), block_addresses(v));
}

// An op whose result nothing reads is traced but not replayed: the text marks it, so the lines it
// prints as replayed are the steps it counts.
TEST(Jit, TextMarksOpsThatAreNotReplayed) {
  Mesh m = mesh8();
  auto step = jit([](const Array& x) {
    Array unused = exp(x);
    (void)unused;
    return x * 2.0;
  });
  Array x = put(iota(64), {8, 8}, NamedSharding(m, P("x")));
  const std::string text = step.lower(x).as_text();
  std::istringstream lines(text);
  int dead = 0, ops = 0;
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("  %", 0) != 0) continue;
    ++ops;
    const bool marked = l.find("(unused: not replayed)") != std::string::npos;
    dead += marked ? 1 : 0;
    EXPECT_EQ(marked, l.find(" = exp(") != std::string::npos) << l;
  }
  EXPECT_EQ(ops, 2) << text;
  EXPECT_EQ(dead, 1) << text;
  EXPECT_NE(text.find("replay: 1 steps"), std::string::npos) << text;
  expect_same(step(x), x * 2.0);
}

TEST(Jit, TheTracedCallsResultsAreNotKeptByTheFunction) {
  Mesh m = mesh8();
  auto f = jit([](const Array& x) { return std::vector<Array>{x * 2.0, x + 1.0}; });
  const Array x = put(iota(1 << 16), {256, 256}, NamedSharding(m, P("x")));
  const int64_t before = memory_stats().bytes_in_use;
  { std::vector<Array> y = f(x); }  // traced
  // The program keeps its constants (two scalars per device), not the results (2 x 256 KiB).
  EXPECT_LT(memory_stats().bytes_in_use - before, 64 * 1024);
}

TEST(Jit, DonationIsInPlaceOnlyWhereTheKernelsAllowIt) {
  Mesh m = mesh8();
  // Per case: the function, and whether its result must (1), must not (0) or may (-1) take the
  // donated w's buffers. Every result must match eager.
  struct Case {
    std::function<Array(const Array&)> f;
    int in_place;
  };
  const Array c = put(iota(512, 0.125f), {8, 8, 8}, NamedSharding(m, P("x")));
  std::vector<Case> cases{
      // The transposed copy goes to a temporary; the sum then reads it element for element.
      {[](const Array& w) {
         return transpose(w, {0, 2, 1}) + 1.0;
       },
       -1},
      // Interleaving copies.
      {[](const Array& w) {
         return concatenate(
             {slice(w, {0, 0, 1}, {8, 8, 8}, {1, 1, 2}), slice(w, {0, 0, 0}, {8, 8, 8}, {1, 1, 2})},
             2);
       },
       -1},
      // The slices are steps of their own, so w is dead before the concatenation writes (its
      // memory may come back from the block cache).
      {[](const Array& w) {
         return concatenate({slice(w, {0, 0, 4}, {8, 8, 8}) * 2.0, slice(w, {0, 0, 0}, {8, 8, 4})},
                            2);
       },
       -1},
      // A product reads all of w while it writes: never in w's buffer.
      {[c](const Array& w) { return matmul(w, c); }, 0},
      {[c](const Array& w) { return matmul_transposed(c, w, false, true); }, 0},
      // w read through two operands: the kernels see one of them.
      {[](const Array& w) { return matmul(w, w); }, 0},
      // Elementwise with w as both operands: writing over w would be right, but the planner may
      // refuse (may_write_over judges one operand slot); the bits must match either way.
      {[](const Array& w) { return w * w; }, -1},
      // The last kernel reads w element for element where it writes.
      {[](const Array& w) {
         return concatenate({slice(w, {0, 4, 0}, {8, 8, 8}), slice(w, {0, 0, 0}, {8, 4, 8})}, 1) +
                w;
       },
       1},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    auto step = jit(cases[k].f, {.donate_argnums = {0}});
    Array w = put(iota(512), {8, 8, 8}, NamedSharding(m, P("x")));
    Array x = step(w);  // traced
    for (int i = 0; i < 2; ++i) {
      const Array want = cases[k].f(x);
      const std::vector<const void*> at = block_addresses(x);
      Array y = step(x);
      expect_same(y, want);
      if (cases[k].in_place >= 0) {
        EXPECT_EQ(block_addresses(y) == at, cases[k].in_place == 1) << "case " << k;
      }
      x = y;
    }
  }
}

TEST(Jit, DonatingOneArrayTwiceOrReturningADonatedInputKeepsTheBits) {
  Mesh m = mesh8();
  // w's last read comes before v's: the first result may take w's buffer, which is v's when the
  // caller passes one Array as both.
  auto f = [](const Array& w, const Array& v) { return std::vector<Array>{w + 1.0, v * 3.0}; };
  // The same Array as two donated arguments, and as a donated and a kept one. The call's
  // argument is the blocks' only holder outside the call (expected values are on the host), but
  // each leaf holds a reference, so neither call may write over them.
  for (std::vector<int> donate : {std::vector<int>{0, 1}, std::vector<int>{0}}) {
    auto step = jit(f, {.donate_argnums = donate});
    Array arg = put(iota(512), {64, 8}, NamedSharding(m, P("x")));
    for (int i = 0; i < 4; ++i) {  // the first call traces
      const std::vector<Array> want = f(arg, arg);
      const std::vector<float> want0 = want[0].to_vector<float>(),
                               want1 = want[1].to_vector<float>();
      std::vector<Array> got = step(arg, arg);
      ASSERT_EQ(got.size(), 2u);
      EXPECT_EQ(got[0].to_vector<float>(), want0) << "call " << i;
      EXPECT_EQ(got[1].to_vector<float>(), want1) << "call " << i;
      arg = got[0];
    }
  }
  // A donated input also returned as it is: the other result must not take its buffer. The
  // caller keeps no other reference (the expected values are on the host).
  auto g = [](const Array& w) { return std::vector<Array>{w + 1.0, w}; };
  auto step = jit(g, {.donate_argnums = {0}});
  Array w = put(iota(512, 0.5f), {64, 8}, NamedSharding(m, P("x")));
  for (int i = 0; i < 4; ++i) {  // the first call traces
    const std::vector<float> want0 = (w + 1.0).to_vector<float>(), want1 = w.to_vector<float>();
    std::vector<Array> got = step(w);
    EXPECT_TRUE(detail::ArrayAccess::blocks(w).empty());
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].to_vector<float>(), want0) << "call " << i;
    EXPECT_EQ(got[1].to_vector<float>(), want1) << "call " << i;
    w = got[0];
  }
}

TEST(Jit, AValueMovedTwiceOntoOneShardingIsMovedOnce) {
  Mesh m = mesh8();
  // The tensor-parallel matmul gradient: dx = dz @ w^T and dw = h^T @ dz both gather dz.
  auto f = [](const Array& h, const Array& dz, const Array& w) {
    return std::vector<Array>{matmul_transposed(dz, w, false, true),
                              matmul_transposed(h, dz, true, false)};
  };
  auto step = jit(f);
  auto args = [&](float k) {
    return std::tuple{put(iota(512, 0.25f * k), {32, 16}, NamedSharding(m, P(None, "x"))),
                      put(iota(512, -0.5f * k), {32, 16}, NamedSharding(m, P(None, "x"))),
                      put(iota(256, 0.125f * k), {16, 16}, NamedSharding(m, P("x")))};
  };
  for (float k : {1.0f, 2.0f, 3.0f}) {
    auto [h, dz, w] = args(k);
    std::vector<Array> want = f(h, dz, w), got = step(h, dz, w);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], want[i]);
  }
  auto [h, dz, w] = args(1);
  const std::string text = step.lower(h, dz, w).as_text();
  // Both products list the gather they need; the replay runs it once.
  size_t gathers = 0;
  for (size_t at = text.find("all_gather"); at != std::string::npos;
       at = text.find("all_gather", at + 1)) {
    ++gathers;
  }
  EXPECT_EQ(gathers, 2u) << text;
  EXPECT_NE(text.find(" 1 reshards from the caller"), std::string::npos) << text;
}

TEST(Jit, ReadingATracedValueIsAnError) {
  Mesh m = mesh8();
  auto step = jit([](const Array& x) {
    Array y = x * 2.0;
    if (y.to_vector<float>()[0] > 0) return y;
    return x;
  });
  Array x = put(iota(8), {8}, NamedSharding(m, P("x")));
  EXPECT_MESHRT_ERROR(step(x), "not known at trace time");
}

TEST(Jit, OutShardingsMustMatchTheOutputs) {
  Mesh m = mesh8();
  auto f = [](const Array& x) { return std::vector<Array>{x * 2.0, x + 1.0}; };
  Array x = put(iota(8), {8}, NamedSharding(m, P("x")));
  NamedSharding r(m, P());
  auto three = jit(f, {.out_shardings = {r, r, r}});
  EXPECT_MESHRT_ERROR(three(x), "[jit] out_shardings has 3 entries", "returns 2 Array leaves");
  auto two = jit(f, {.out_shardings = {r, std::nullopt}});
  std::vector<Array> got = two(x);
  EXPECT_TRUE(got[0].sharding() == r);
  EXPECT_TRUE(got[1].sharding() == NamedSharding(m, P("x")));
}

TEST(Jit, ReadingInsideValueAndGradInsideJitIsAnError) {
  Mesh m = mesh8();
  auto loss = [](const Array& w) {
    Array l = sum(w * w);
    (void)l.to_vector<float>();
    return l;
  };
  auto step = jit(value_and_grad(loss));
  Array w = put(iota(8), {8}, NamedSharding(m, P("x")));
  EXPECT_MESHRT_ERROR(step(w), "not known at trace time");
}

TEST(Jit, ConstantsAndCreationInside) {
  Mesh m = mesh8();
  NamedSharding s(m, P("x"));
  Array c = put(iota(8, 1.0f), {8}, s);
  auto f = [&](const Array& x) { return x + c + zeros({8}, DType::f32, s) + 1.5; };
  auto step = jit(f);
  Array x = put(iota(8), {8}, s);
  expect_same(step(x), f(x));
  Array x2 = put(iota(8, 2.0f), {8}, s);
  expect_same(step(x2), f(x2));
}

TEST(Jit, LowerAsTextShowsOpsAndCollectives) {
  Mesh m = mesh8();
  auto f = [&](const Array& x) {
    return with_sharding_constraint(sum(2.0 * sin(x) + 1.0, 0), NamedSharding(m, P("x")));
  };
  auto step = jit(f);
  Array x = put(iota(64 * 8), {64, 8}, NamedSharding(m, P("x")));
  const std::string text = step.lower(x).as_text();
  EXPECT_NE(text.find("sin("), std::string::npos) << text;
  EXPECT_NE(text.find("mul_scalar("), std::string::npos) << text;
  EXPECT_NE(text.find("psum_scatter"), std::string::npos) << text;
  EXPECT_NE(text.find("bytes per device"), std::string::npos) << text;
  EXPECT_NE(text.find("float32[64,8]"), std::string::npos) << text;
  EXPECT_EQ(step.trace_count(), 1u);
  expect_same(step(x), f(x));
  EXPECT_EQ(step.trace_count(), 1u);
}

TEST(Jit, AsDotRendersWithGraphviz) {
  Mesh m = mesh8();
  auto f = [&](const Array& x) {
    return with_sharding_constraint(sum(2.0 * sin(x) + 1.0, 0), NamedSharding(m, P("x")));
  };
  Array x = put(iota(64 * 8), {64, 8}, NamedSharding(m, P("x")));
  const std::string dot = jit(f).lower(x).as_dot();
  EXPECT_NE(dot.find("digraph"), std::string::npos);
  EXPECT_NE(dot.find("psum_scatter"), std::string::npos);
  if (std::system("dot -V > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "graphviz (dot) is not installed: the .dot text was checked, not rendered";
  }
  const std::string path = ::testing::TempDir() + "meshrt_jit_test.dot";
  {
    std::ofstream out(path);
    out << dot;
  }
  const std::string cmd = "dot -Tsvg " + path + " -o " + path + ".svg";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << dot;
  std::ifstream svg(path + ".svg");
  std::string first;
  std::getline(svg, first);
  EXPECT_FALSE(first.empty());
}

}  // namespace

// stop_gradient drops an Array's trace id but not its blocks': reading it inside jit is still a
// value jit cannot know at trace time.
TEST(Jit, ReadingAStopGradientValueInsideIsAnError) {
  Mesh m = mesh8();
  auto f = jit([](const Array& x) {
    const float v = stop_gradient(x * 2.0).to_vector<float>()[0];
    return x * static_cast<double>(v);
  });
  Array x = put(iota(8), {8}, NamedSharding(m, P("x")));
  EXPECT_MESHRT_ERROR(f(x), "not known at trace time");
}

// A captured Array that is also the argument at trace time: its block and the argument's are one
// memory, and the compiled step must not read the argument for both later.
TEST(Jit, ACapturedArrayPassedAsTheArgumentAtTraceTime) {
  Mesh m = mesh8();
  NamedSharding s(m, P("x"));
  Array x0 = put(iota(64, 0.5f), {64}, s);
  auto f = [&](const Array& x) { return x - x0; };
  auto step = jit(f);
  expect_same(step(x0), f(x0));
  Array x1 = put(iota(64, -1.5f), {64}, s);
  expect_same(step(x1), f(x1));
}
