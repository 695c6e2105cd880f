// shard_map inside a jitted function: the bodies recorded once as ops per device and replayed
// with the eager shard_map's bits, with global-view code around them, under value_and_grad, and
// what a recording cannot repeat refused with an Error.
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "runtime/detail/access.h"
#include "tests/test_util.h"

using namespace meshrt;

namespace {

Mesh mesh8() { return make_mesh({8}, {"x"}); }
Mesh mesh42() { return make_mesh({4, 2}, {"x", "y"}); }

// Values that differ per call (`seed`) and per element, with negatives, zeros and repeats.
std::vector<float> values(int64_t n, float seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = seed * 0.37f + 0.25f * static_cast<float>(static_cast<int64_t>(i % 23) - 11);
  }
  return v;
}

Array put(const std::vector<float>& v, Shape shape, const Sharding& s) {
  return device_put(v, std::move(shape), s);
}

using test::expect_same;  // Arrays: dtype, shape, sharding, pending sums and bits

void expect_same(const std::vector<Array>& a, const std::vector<Array>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("result " + std::to_string(i));
    expect_same(a[i], b[i]);
  }
}

// sqrt(x^2): an abs made of reported ops.
Tensor abs_via_square(const Tensor& h) { return sqrt(h * h); }

// A body that runs every op family and every collective over the 4x2 mesh: per device a (4, 6)
// block of x (split over x) and the (6, 4) w (replicated).
std::vector<Tensor> every_family(Context& ctx, const Tensor& xb, const Tensor& w) {
  Tensor h = matmul(xb, w);                                             // (4, 4)
  h = where(h > 0.5, tanh(h), h * 0.5 - 1);                             // where, scalars
  Tensor s = softmax(h, 1) + log_softmax(h, 0) * 0.125;                 // normalisations
  Tensor r = sum(exp(h * 0.1), 1, true) / (max(h, 0) + 2);              // reductions, broadcast
  Tensor c = concatenate({transpose(h), slice(h, {0, 1}, {4, 3})}, 1);  // (4, 6)
  c = pad(c, {{1, 0}, {0, 2}}, -0.75);                                  // (5, 8)
  Tensor i = astype(argmax(h, 0), DType::f32) + astype(h > 0, DType::f32);
  Tensor g = ctx.all_gather(reshape(c, {40}), "y", 0, true);  // (80,)
  Tensor p = ctx.psum(s + r, AxisNames({"x", "y"}));
  Tensor m = ctx.pmean(sqrt(abs_via_square(h) + 1), "x");
  Tensor q = ctx.ppermute(i, "x", {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
  Tensor sc = ctx.psum_scatter(h, "x", 0, true);    // (1, 4)
  Tensor a2a = ctx.all_to_all(h, "y", 1, 0, true);  // (8, 2), varies on y
  Tensor mx = ctx.pmax(min(h, 1) - 3, "y");
  Tensor row0 = h[2] * 3 + 1.5;  // row
  Tensor du = dynamic_update_slice(h, ones({2, 2}, DType::f32, ctx.device()), {1, 1});
  Tensor ints = astype(h * 4, DType::i32) + 3;  // weak int scalar
  Tensor back = astype(ints, DType::f32) / 2;
  return {p + m + q + mx + du + back, g, sc, a2a, reshape(row0, {2, 2}), -c, ints};
}

std::vector<Array> every_family_program(const Mesh& m, const Array& x, const Array& w) {
  auto sm = shard_map(every_family, m, {P("x"), P()},
                      {P("x"), P("x"), P("x"), P("x", "y"), P("x"), P("x"), P("x")});
  return sm(x, w);
}

}  // namespace

TEST(JitShardMap, ReplaysEveryOpFamilyAndCollectiveBitForBitOnNewInputs) {
  Mesh m = mesh42();
  NamedSharding rows(m, P("x")), rep(m, P());
  auto f = [&](const Array& x, const Array& w) { return every_family_program(m, x, w); };
  auto step = jit(f);
  for (float seed : {1.0f, -2.0f, 3.5f}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Array x = put(values(16 * 6, seed), {16, 6}, rows);
    Array w = put(values(6 * 4, seed + 0.5f), {6, 4}, rep);
    std::vector<Array> got = step(x, w);
    expect_same(got, f(x, w));
    EXPECT_EQ(got.back().dtype(), DType::i32);  // int32 + a weak integer scalar stays int32
  }
  EXPECT_EQ(step.trace_count(), 1u);
}

TEST(JitShardMap, TheBodyRunsOnceAtTraceTimeOnly) {
  Mesh m = mesh8();
  std::atomic<int> calls{0};
  auto f = [&](const Array& x) {
    const double scale = 3.0;  // a local the body captures by reference: gone after the trace
    auto body = [&](Context& ctx, const Tensor& b) {
      calls.fetch_add(1);
      return ctx.psum(b * scale, "x") + b;
    };
    return shard_map(body, m, {P("x")}, P("x"))(x);
  };
  auto step = jit(f);
  NamedSharding s(m, P("x"));
  for (float seed : {1.0f, 2.0f, -4.0f}) step(put(values(32, seed), {32}, s));
  EXPECT_EQ(calls.load(), 8);  // once per device, when jit traced
  Array x = put(values(32, 7.0f), {32}, s);
  expect_same(step(x), f(x));
}

TEST(JitShardMap, GlobalViewOpsAroundTheShardMapAndArgumentsPlacedAsEager) {
  Mesh m = mesh42();
  NamedSharding rows(m, P("x")), rep(m, P()), cols(m, P(None, "y"));
  auto body = [](Context& ctx, const Tensor& a, const Tensor& b) {
    return std::vector<Tensor>{ctx.psum(a * b, "y"), ctx.all_gather(a, "x", 0, true)};
  };
  auto f = [&](const Array& x, const Array& y) {
    Array pre = sin(x) * 2.0 + 1.0;  // on rows, resharded to the body's in_spec (x, y)
    std::vector<Array> r =
        shard_map(body, m, {P("x", "y"), P("x", "y")}, {P("x"), P(None, "y")})(pre, y);
    return std::vector<Array>{sum(r[0], 1), r[1] - 0.5};
  };
  auto step = jit(f);
  for (float seed : {0.5f, -1.5f}) {
    Array x = put(values(8 * 4, seed), {8, 4}, rows);
    Array y = put(values(8 * 4, seed * 2), {8, 4}, seed > 0 ? rep : cols);
    expect_same(step(x, y), f(x, y));
  }
  Array x = put(values(8 * 4, 1), {8, 4}, rows);
  Array y = put(values(8 * 4, 2), {8, 4}, rep);
  const std::string text = step.lower(x, y).as_text();
  EXPECT_NE(text.find("shard_map[<lambda in TestBody>]("), std::string::npos) << text;
  EXPECT_NE(text.find("body: "), std::string::npos) << text;
  EXPECT_NE(text.find("psum over ('y',): float32[2,2] -> float32[2,2] per device"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("all_gather over ('x',): float32[2,2] -> float32[8,2] per device"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("args[0] moved to P('x', 'y') for in_specs[0]"), std::string::npos) << text;
  EXPECT_NE(text.find("(1 with collectives)"), std::string::npos) << text;
  EXPECT_NE(text.find("1 shard_maps (their recorded bodies)"), std::string::npos) << text;
  const std::string dot = step.lower(x, y).as_dot();
  EXPECT_NE(dot.find("psum over ('y',)"), std::string::npos) << dot;
}

// A data-parallel step in the per-device style: the loss's shard_map differentiated inside jit.
// The transpose body reads the forward body's values (tanh's output, the blocks of x), which jit
// passes between the two steps: replayed on new inputs, the gradients are eager's.
TEST(JitShardMap, ValueAndGradThroughShardMapInsideJit) {
  Mesh m = mesh8();
  auto loss = [&](const Array& w, const Array& x) {
    auto body = [](Context& ctx, const Tensor& wb, const Tensor& xb) {
      Tensor h = tanh(matmul(xb, wb));
      Tensor l = sum(h * h) + sum(relu(h - 0.1)) * 0.5;
      return ctx.pmean(l, "x");
    };
    return shard_map(body, m, {P(), P("x")}, P())(w, x);
  };
  auto eager = value_and_grad(loss);
  auto step = jit(eager);
  NamedSharding rep(m, P()), rows(m, P("x"));
  for (float seed : {1.0f, -0.5f, 2.25f}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Array w = put(values(6 * 3, seed), {6, 3}, rep);
    Array x = put(values(16 * 6, seed * 0.3f), {16, 6}, rows);
    auto [l, g] = step(w, x);
    auto [le, ge] = eager(w, x);
    expect_same(l, le);
    expect_same(g, ge);
  }
  Array w = put(values(6 * 3, 1), {6, 3}, rep);
  Array x = put(values(16 * 6, 2), {16, 6}, rows);
  const std::string text = step.lower(w, x).as_text();
  EXPECT_NE(text.find("2 shard_maps"), std::string::npos) << text;
  EXPECT_NE(text.find("shard_map[transpose("), std::string::npos) << text;
}

// Two layers and a training update, every value of the step new on each call.
TEST(JitShardMap, TrainingStepWithUpdateMatchesEager) {
  Mesh m = mesh8();
  auto loss = [&](const std::vector<Array>& p, const Array& x) {
    auto body = [](Context& ctx, const std::vector<Tensor>& in) {
      Tensor h = relu(matmul(in[2], in[0]));
      Tensor y = matmul(h, in[1]);
      return std::vector<Tensor>{ctx.psum(sum(y * y) / 64, "x")};
    };
    return shard_map(body, m, {P(), P(), P("x")}, {P()})({p[0], p[1], x})[0];
  };
  auto update = [&](std::vector<Array> p, const Array& x) {
    auto [l, g] = value_and_grad(loss)(p, x);
    for (size_t i = 0; i < p.size(); ++i) p[i] = p[i] - 0.05 * g[i];
    return std::make_pair(l, p);
  };
  auto step = jit(update);
  NamedSharding rep(m, P()), rows(m, P("x"));
  std::vector<Array> pj{put(values(4 * 5, 1), {4, 5}, rep), put(values(5 * 2, 2), {5, 2}, rep)};
  std::vector<Array> pe = pj;
  for (int it = 0; it < 4; ++it) {
    Array x = put(values(16 * 4, static_cast<float>(it) - 1.5f), {16, 4}, rows);
    auto [lj, nj] = step(pj, x);
    auto [le, ne] = update(pe, x);
    expect_same(lj, le);
    expect_same(nj, ne);
    pj = nj;
    pe = ne;
  }
}

TEST(JitShardMap, ConstantsInsideTheBodyAreKept) {
  Mesh m = mesh8();
  auto f = [&](const Array& x) {
    auto body = [](Context& ctx, const Tensor& b) {
      const double i = static_cast<double>(ctx.axis_index("x"));
      Tensor noise = random::normal(random::key(7), b.shape(), ctx.device());
      return b * full(b.shape(), i, DType::f32, ctx.device()) + noise +
             arange(4, DType::f32, ctx.device());
    };
    return shard_map(body, m, {P("x")}, P("x"))(x);
  };
  auto step = jit(f);
  NamedSharding s(m, P("x"));
  for (float seed : {1.0f, -3.0f}) {
    Array x = put(values(32, seed), {32}, s);
    expect_same(step(x), f(x));
  }
}

// Ops whose attributes differ per device (a scalar or a slice taken from axis_index): each device
// replays its own, never one device's compiled for all.
TEST(JitShardMap, PerDeviceAttributesAreEachDevicesOwn) {
  Mesh m = mesh8();
  auto f = [&](const Array& x) {
    auto body = [](Context& ctx, const Tensor& b) {
      const int64_t i = ctx.axis_index("x");
      Tensor y = exp(b * static_cast<double>(i) + 1.0);
      return concatenate({slice(y, {i % 2}, {i % 2 + 2}), y}, 0);
    };
    return shard_map(body, m, {P("x")}, P("x"))(x);
  };
  auto step = jit(f);
  auto loss = [&](const Array& x) { return sum(f(x) * f(x)); };
  auto grad_step = jit(value_and_grad(loss));
  NamedSharding s(m, P("x"));
  for (float seed : {1.0f, -0.5f}) {
    Array x = put(values(32, seed), {32}, s);
    expect_same(step(x), f(x));
    auto [l, g] = grad_step(x);
    auto [le, ge] = value_and_grad(loss)(x);
    expect_same(l, le);
    expect_same(g, ge);
  }
}

TEST(JitShardMap, CollectiveOptionsAreReplayed) {
  Mesh m = mesh8();
  auto f = [&](const Array& x) {
    auto body = [](Context& ctx, const Tensor& b) {
      Tensor r = ctx.psum(b, "x", {.algo = CollectiveAlgo::ring});
      Tensor d = ctx.psum(b * 0.5, "x", {.algo = CollectiveAlgo::bidi_ring, .deterministic = true});
      return ctx.all_gather(r + d, "x", 0, true, {.algo = CollectiveAlgo::ring});
    };
    return shard_map(body, m, {P("x")}, P())(x);
  };
  auto step = jit(f);
  NamedSharding s(m, P("x"));
  for (float seed : {1.0f, 5.0f}) {
    Array x = put(values(8 * 1024, seed), {8 * 1024}, s);
    expect_same(step(x), f(x));
  }
}

// Eager checks at run time that an output its out_spec says is replicated is the same on every
// device; the replay checks it on every call too, so data that breaks it is the same Error.
TEST(JitShardMap, TheReplicationCheckRunsOnEveryCall) {
  Mesh m = mesh8();
  auto f = [&](const Array& x) {
    return shard_map([](Context&, const Tensor& b) { return b * 2.0; }, m, {P("x")}, P())(x);
  };
  auto step = jit(f);
  NamedSharding s(m, P("x"));
  Array same = put(std::vector<float>(32, 1.5f), {32}, s);  // every block equal: it passes
  expect_same(step(same), f(same));
  Array differ = put(values(32, 1), {32}, s);
  EXPECT_MESHRT_ERROR(f(differ), "[shard_map] out_specs[0] is P()", "hold different values");
  EXPECT_MESHRT_ERROR(step(differ), "[shard_map] out_specs[0] is P()", "hold different values");
}

TEST(JitShardMap, WhatARecordingCannotRepeatIsAClearError) {
  Mesh m = mesh8();
  NamedSharding s(m, P("x"));
  Array x = put(values(32, 1), {32}, s);
  auto async = jit([&](const Array& a) {
    auto body = [](Context& ctx, const Tensor& b) {
      PendingTensor p = ctx.ppermute_start(b, "x", {{0, 1}, {1, 0}});
      return p.wait();
    };
    return shard_map(body, m, {P("x")}, P("x"))(a);
  });
  EXPECT_MESHRT_ERROR(async(x), "[jit] ppermute_start inside a shard_map body under jit",
                      "use the synchronous ppermute");
  auto read = jit([&](const Array& a) {
    auto body = [](Context&, const Tensor& b) {
      Tensor y = b * 2.0;
      (void)y.to_vector<float>();
      return y;
    };
    return shard_map(body, m, {P("x")}, P("x"))(a);
  });
  EXPECT_MESHRT_ERROR(read(x), "[jit] to_vector of a value computed inside a shard_map body");
  // A captured Array computed by the jitted function, read on the host inside the body.
  auto captured = jit([&](const Array& a) {
    Array twice = a * 2.0;
    auto body = [&](Context&, const Tensor& b) {
      (void)twice.to_vector<float>();
      return b;
    };
    return shard_map(body, m, {P("x")}, P("x"))(a);
  });
  EXPECT_MESHRT_ERROR(captured(x), "not known at trace time");
}

// A value one body computes and a later body reads (captured by reference): jit passes it from
// the first step to the second, so the replay reads the new call's value, not the trace's.
TEST(JitShardMap, ValuesOfAnEarlierBodyPassToALaterOne) {
  Mesh m = mesh8();
  std::vector<Tensor> stash(8);
  auto first = [&](Context& ctx, const Tensor& b) {
    stash[static_cast<size_t>(ctx.axis_index("x"))] = exp(b * 0.5);
    return b;
  };
  auto second = [&](Context& ctx, const Tensor& b) {
    return b + stash[static_cast<size_t>(ctx.axis_index("x"))];
  };
  auto f = [&](const Array& x) {
    Array kept = shard_map(first, m, {P("x")}, P("x"))(x);
    return shard_map(second, m, {P("x")}, P("x"))(kept * 2.0);
  };
  auto step = jit(f);
  NamedSharding s(m, P("x"));
  for (float seed : {1.0f, -2.0f, 0.5f}) {
    Array x = put(values(32, seed), {32}, s);
    expect_same(step(x), f(x));
  }
  // The second body over a mesh that orders the devices the other way: refused, not guessed.
  std::vector<Device> reversed = m.devices();
  std::reverse(reversed.begin(), reversed.end());
  Mesh r(reversed, {8}, {"x"});
  auto on_device = [&](Context& ctx, const Tensor& b) {  // the stash of this body's device
    const auto at = std::find(m.devices().begin(), m.devices().end(), ctx.device());
    return b + stash[static_cast<size_t>(at - m.devices().begin())];
  };
  auto g = [&](const Array& x) {
    Array kept = shard_map(first, m, {P("x")}, P("x"))(x);
    return shard_map(on_device, r, {P("x")}, P("x"))(device_put(kept, NamedSharding(r, P("x"))));
  };
  Array x = put(values(32, 1), {32}, s);
  (void)g(x);  // eager: fine
  EXPECT_MESHRT_ERROR(jit(g)(x), "over a mesh of other devices or in another order");
  // The second body over more devices than the first: refused too (the first holds no block on
  // the others).
  Mesh m4(std::vector<Device>(m.devices().begin(), m.devices().begin() + 4), {4}, {"x"});
  auto wider = [&](const Array& a) {
    Array kept = shard_map(first, m4, {P("x")}, P("x"))(device_put(a, NamedSharding(m4, P("x"))));
    auto body = [&](Context& ctx, const Tensor& b) {
      const auto i = static_cast<size_t>(ctx.axis_index("x"));
      return i < 4 ? b + slice(stash[i], {0}, {4}) : b;
    };
    return std::vector<Array>{kept, shard_map(body, m, {P("x")}, P("x"))(a)};
  };
  (void)wider(x);
  EXPECT_MESHRT_ERROR(jit(wider)(x), "over a mesh of other devices or in another order");
}

// One Array passed as two arguments at trace time, two different ones later: the recording keeps
// them apart (the body gets copies of its blocks; the kernel tape refuses operands sharing
// memory), with and without value_and_grad.
TEST(JitShardMap, AnArgumentPassedTwiceAtTraceTimeStaysTwoValues) {
  Mesh m = mesh8();
  NamedSharding s(m, P("x"));
  auto f = [&](const Array& a, const Array& c) {
    return shard_map([](Context&, const Tensor& a, const Tensor& c) { return a - c * 2.0; }, m,
                     {P("x"), P("x")}, P("x"))(a, c);
  };
  auto loss = [&](const Array& a, const Array& c) {
    auto body = [](Context& ctx, const Tensor& a, const Tensor& c) {
      return std::vector<Tensor>{ctx.psum(sum(sin(a) * exp(c * 0.1)), "x"), reshape(a, {2, 2})};
    };
    std::vector<Array> r = shard_map(body, m, {P("x"), P("x")}, {P(), P("x")})(a, c);
    return r[0] + sum(r[1]) * 0.5;
  };
  auto step = jit(f);
  auto grad_step = jit(value_and_grad<0, 1>(loss));
  Array w = put(values(32, 1), {32}, s);
  Array v = put(values(32, -3), {32}, s);
  (void)step(w, w);
  (void)grad_step(w, w);
  expect_same(step(w, v), f(w, v));
  auto [l, g] = grad_step(w, v);
  auto [le, ge] = value_and_grad<0, 1>(loss)(w, v);
  expect_same(l, le);
  expect_same(std::get<0>(g), std::get<0>(ge));
  expect_same(std::get<1>(g), std::get<1>(ge));
}

// max/min of a bool Tensor is reported as an op (it was a value computed without a report, kept
// as the trace's constant); a per-device -0.0 scalar is not +0.0's compiled run.
TEST(JitShardMap, BoolReductionsAndSignedZeroScalarsReplay) {
  Mesh m = mesh8();
  NamedSharding s(m, P("x"));
  auto f = [&](const Array& x) {
    auto body = [](Context& ctx, const Tensor& b) {
      Tensor any = astype(max(b > 0.0, 0, true), DType::f32);
      const double zero = ctx.axis_index("x") == 0 ? -0.0 : 0.0;
      return exp(b) * zero + any;
    };
    return shard_map(body, m, {P("x")}, P("x"))(x);
  };
  auto step = jit(f);
  (void)step(put(std::vector<float>(32, 1.f), {32}, s));
  for (float seed : {-9.0f, 2.0f}) {
    Array x = put(values(32, seed), {32}, s);
    expect_same(step(x), f(x));
  }
}

// Host reads of what a body computed or was given are refused wherever they happen: inside the
// body (a copy of the handle, stop_gradient's, or a tape's view of an operand), and outside it
// (a Tensor the body stashed, read or device_put by the jitted function).
TEST(JitShardMap, HostReadsOfBodyValuesAreRefusedEverywhere) {
  Mesh m = mesh8();
  NamedSharding s(m, P("x")), rep(m, P());
  Array x = put(values(32, 1), {32}, s);
  auto stopped = jit([&](const Array& a) {
    auto body = [](Context&, const Tensor& b) {
      const float v = stop_gradient(b * 2.0).to_vector<float>()[0];
      return b * v;
    };
    return shard_map(body, m, {P("x")}, P("x"))(a);
  });
  EXPECT_MESHRT_ERROR(stopped(x), "[jit] to_vector of a value computed inside a shard_map body");
  auto loss = [&](const Array& w, const Array& a) {
    auto body = [](Context& ctx, const Tensor& wb, const Tensor& ab) {
      const float v = ab.to_vector<float>()[0];  // not differentiated: the tape re-names it
      return ctx.psum(sum(wb * v), "x");
    };
    return shard_map(body, m, {P("x"), P("x")}, P())(w, a);
  };
  EXPECT_MESHRT_ERROR(jit(value_and_grad(loss))(x, x),
                      "[jit] to_vector of a value computed inside a shard_map body");
  std::vector<Tensor> stash(8);
  auto keep = [&](Context& ctx, const Tensor& b) {
    stash[static_cast<size_t>(ctx.axis_index("x"))] = b * 3.0;
    return b + 1.0;
  };
  auto read_after = jit([&](const Array& a) {
    Array y = shard_map(keep, m, {P("x")}, P("x"))(a);
    return y * static_cast<double>(stash[0].to_vector<float>()[0]);
  });
  EXPECT_MESHRT_ERROR(read_after(x), "[jit] to_vector of a value computed inside a shard_map body");
  auto put_after = jit([&](const Array& a) {
    Array y = shard_map(keep, m, {P("x")}, P("x"))(a);
    return y + device_put(stash[2], rep);
  });
  EXPECT_MESHRT_ERROR(put_after(x), "[jit] device_put of a value computed inside a shard_map body");
}

// A forward body whose ops differ per device (C++ control flow on axis_index) under
// value_and_grad: each position's values pass to the transpose body on their own.
TEST(JitShardMap, ValueAndGradThroughABodyThatBranchesPerDevice) {
  Mesh m = mesh8();
  auto loss = [&](const Array& x) {
    auto body = [](Context& ctx, const Tensor& b) {
      const int64_t i = ctx.axis_index("x");
      Tensor h = i % 2 == 0 ? tanh(b) * 2.0 : exp(b * 0.5) + sin(b);
      if (i == 3) h = h * h;
      return ctx.psum(sum(h), "x");
    };
    return shard_map(body, m, {P("x")}, P())(x);
  };
  auto step = jit(value_and_grad(loss));
  NamedSharding s(m, P("x"));
  for (float seed : {1.0f, -2.5f, 0.75f}) {
    Array x = put(values(32, seed), {32}, s);
    auto [l, g] = step(x);
    auto [le, ge] = value_and_grad(loss)(x);
    expect_same(l, le);
    expect_same(g, ge);
  }
}

// What the review found besides: a body reading a value its sibling on another device computed,
// a body reading an Array the function computed (after stop_gradient), and a Tensor op of the
// function on a value a body computed: each an Error, not the trace's value kept.
TEST(JitShardMap, BodyValuesReachNoHostOrOutsideOp) {
  Mesh m = mesh8();
  NamedSharding s(m, P("x"));
  Array x = put(values(32, 1), {32}, s);
  std::vector<Tensor> stash(8);
  auto sibling = jit([&](const Array& a) {
    auto body = [&](Context& ctx, const Tensor& b) {
      const auto i = static_cast<size_t>(ctx.axis_index("x"));
      stash[i] = b * 2.0;
      Tensor total = ctx.psum(sum(b), "x");  // every device has stashed once this returns
      return total + b * static_cast<double>(stash[(i + 1) % 8].to_vector<float>()[0]);
    };
    return shard_map(body, m, {P("x")}, P("x"))(a);
  });
  EXPECT_MESHRT_ERROR(sibling(x), "[jit] to_vector of a value computed inside a shard_map body");
  auto stopped = jit([&](const Array& a) {
    Array twice = stop_gradient(a * 2.0);
    auto body = [&](Context&, const Tensor& b) {
      return b * static_cast<double>(twice.to_vector<float>()[0]);
    };
    return shard_map(body, m, {P("x")}, P("x"))(a);
  });
  EXPECT_MESHRT_ERROR(stopped(x), "not known at trace time");
  auto outside_op = jit([&](const Array& a) {
    auto body = [&](Context& ctx, const Tensor& b) {
      stash[static_cast<size_t>(ctx.axis_index("x"))] = b * 3.0;
      return b;
    };
    Array y = shard_map(body, m, {P("x")}, P("x"))(a);
    Tensor t = stash[0] * 1.0;
    return y + device_put(t, NamedSharding(m, P()));
  });
  EXPECT_MESHRT_ERROR(outside_op(x),
                      "[jit] the Tensor op 'mul_scalar' ran outside any shard_map body");
}
