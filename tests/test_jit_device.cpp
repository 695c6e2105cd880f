// jit on a device platform: the "cuda" platform here is tests/lazy_devices.h's stand-in (kernels
// queued per device, run only when something waits; host_addressable() false). jit records each
// device-local step's kernels and keeps them only after replaying them into pattern-filled buffers
// and reading the results back through the backend's copies; then every call replays the
// recorded kernels into planned buffers, donated inputs are written in place, and every result
// equals eager's bit for bit. (On cuda the same path runs with cuBLAS and the CUDA kernels.)
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/detail/access.h"
#include "runtime/detail/platform.h"
#include "tests/lazy_devices.h"

namespace meshrt {
namespace {

constexpr int kDevices = 4;

test::LazyDevices& lazy() {
  static test::LazyDevices* fake = [] {
    auto b = std::make_unique<test::LazyDevices>(kDevices);
    test::LazyDevices* p = b.get();
    detail::install_backend_for_testing(Device::Kind::cuda, std::move(b));
    return p;
  }();
  return *fake;
}

std::vector<float> iota(int64_t n, float start, float step) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

void expect_same_bits(const Array& got, const Array& want) {
  ASSERT_EQ(got.shape(), want.shape());
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  ASSERT_EQ(g.size(), w.size());
  EXPECT_EQ(std::memcmp(g.data(), w.data(), g.size() * sizeof(float)), 0);
}

std::vector<const void*> block_addresses(const Array& a) {
  std::vector<const void*> v;
  for (const Tensor& t : detail::ArrayAccess::blocks(a)) v.push_back(t.data());
  return v;
}

TEST(JitOnADevicePlatform, CompilesDeviceLocalStepsAndReplaysThemBitForBit) {
  lazy();
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  const NamedSharding sx(mesh, P("x"));
  auto f = [](const Array& x, const Array& w) {
    return relu(matmul(x, w) + 0.5) * exp(x[0] * 0.0) - sin(x) * 0.25 + sum(x, 1, true);
  };
  auto step = jit(f);
  const NamedSharding rep(mesh, P());
  for (int round = 0; round < 3; ++round) {
    const Array x = device_put(iota(16 * 8, 0.1f * round, 0.01f), {16, 8}, sx);
    const Array w = device_put(iota(8 * 8, -0.3f, 0.02f + 0.01f * round), {8, 8}, rep);
    expect_same_bits(step(x, w), f(x, w));
  }
  EXPECT_EQ(step.trace_count(), 1u);
  const Array x = device_put(iota(16 * 8, 0.f, 1.f), {16, 8}, sx);
  const Array w = device_put(iota(64, 0.f, 1.f), {8, 8}, rep);
  const std::string text = step.lower(x, w).as_text();
  EXPECT_EQ(text.find("compiled: 0 device-local steps"), std::string::npos) << text;
  EXPECT_NE(text.find("device-local steps as"), std::string::npos) << text;
  EXPECT_EQ(text.find("not host-addressable"), std::string::npos) << text;
}

TEST(JitOnADevicePlatform, DonationWritesInPlaceAndLeavesKeptCopiesAlone) {
  lazy();
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  auto f = [](const Array& w, const Array& g) { return w - 0.5 * sin(g); };
  auto step = jit(f, {.donate_argnums = {0}});
  const Array g = device_put(iota(32 * 16, 0.25f, 0.01f), {32, 16}, NamedSharding(mesh, P("x")));
  Array w = device_put(iota(32 * 16, 0.f, 1.f), {32, 16}, NamedSharding(mesh, P("x")));
  Array want = f(w, g);
  Array w1 = step(w, g);  // traced
  expect_same_bits(w1, want);
  for (int i = 0; i < 3; ++i) {
    want = f(w1, g);
    const std::vector<const void*> at = block_addresses(w1);
    Array w2 = step(w1, g);
    expect_same_bits(w2, want);
    EXPECT_EQ(block_addresses(w2), at) << "call " << i << ": the update is not in w1's buffers";
    w1 = w2;
  }
  const Array kept = w1;
  const std::vector<float> kept_values = kept.to_vector<float>();
  Array w3 = step(w1, g);
  EXPECT_EQ(kept.to_vector<float>(), kept_values);
  EXPECT_NE(block_addresses(w3), block_addresses(kept));
}

// Compiled steps replayed as work graphs (cuda: CUDA graphs under MESHRT_CUDA_GRAPHS=1; here the
// stand-in's captured closures, which hold their pointers as a CUDA graph's nodes do): the
// second call that meets a step's addresses captures it, later ones with those addresses launch
// the graph, and a step whose addresses are new never launches an old graph (one that left an
// address out of its set would replay a stale pointer here). Every result is eager's bit for
// bit.
TEST(JitOnADevicePlatform, ReplaysStepsAsGraphsWhereAddressesRepeat) {
  lazy().set_graphs(true);
  struct Off {
    ~Off() { lazy().set_graphs(false); }
  } off;
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  const NamedSharding sx(mesh, P("x"));
  auto f = [](const Array& w, const Array& g) {
    return relu(w - 0.5 * sin(g)) + sum(g, 1, true) * 0.125;
  };
  auto step = jit(f, {.donate_argnums = {0}});  // in place: w keeps its buffers call after call
  const Array g1 = device_put(iota(32 * 16, 0.25f, 0.01f), {32, 16}, sx);
  const Array g2 = device_put(iota(32 * 16, -0.5f, 0.02f), {32, 16}, sx);
  Array w = device_put(iota(32 * 16, 0.f, 0.5f), {32, 16}, sx);
  const int captures = lazy().graph_captures();
  std::vector<int64_t> launched;
  for (int call = 0; call < 7; ++call) {
    const Array& g = call == 5 ? g2 : g1;  // call 5: other addresses
    const Array want = f(w, g);
    const int64_t before = lazy().graph_launches();
    Array next = step(w, g);
    launched.push_back(lazy().graph_launches() - before);
    SCOPED_TRACE(call);
    expect_same_bits(next, want);
    w = next;
  }
  EXPECT_GT(lazy().graph_captures(), captures);
  EXPECT_GT(launched[3], 0) << "a step whose addresses repeat did not launch its graph";
  EXPECT_GT(launched[4], 0);
  // Steps that read g run as usual; those that read only planned buffers and w may launch.
  EXPECT_LT(launched[5], launched[4]) << "new addresses launched a graph captured for others";
  EXPECT_GT(launched[6], 0) << "back to the first addresses: their graph is launched again";
}

// Pending sums resolved one after another (as a data-parallel step's gradients are, at their
// sharding constraints) run as one psum over their blocks laid end to end on a device platform:
// one collective instead of one per sum, with the direct algorithm's bits (each element's sum
// is the same whatever else is summed with it).
TEST(JitOnADevicePlatform, ConsecutivePsumsRunAsOneCollectiveWithTheSameBits) {
  lazy();
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  const NamedSharding sx(mesh, P("x")), rep(mesh, P());
  auto f = [rep](const Array& x, const Array& w) {
    const Array a = sum(x, 0), b = sum(sin(x) * 0.5, 0), c = matmul(w, x);  // pending over x
    return std::vector<Array>{with_sharding_constraint(a, rep), with_sharding_constraint(b, rep),
                              with_sharding_constraint(c, rep), sum(x, 1)};
  };
  auto step = jit(f);
  const Array w0 =
      device_put(iota(3 * 16, 0.5f, -0.03f), {3, 16}, NamedSharding(mesh, P(None, "x")));
  const Array x0 = device_put(iota(16 * 8, 0.f, 0.37f), {16, 8}, sx);
  (void)step(x0, w0);  // traced
  const std::string text = step.lower(x0, w0).as_text();
  EXPECT_NE(text.find("psum buckets: 3 psums taken as 1 collective"), std::string::npos) << text;
  for (int round = 0; round < 3; ++round) {
    const Array x = device_put(iota(16 * 8, 0.1f * round, 0.013f), {16, 8}, sx);
    const Array w = device_put(iota(3 * 16, -0.2f, 0.02f + 0.01f * round), {3, 16},
                               NamedSharding(mesh, P(None, "x")));
    const std::vector<Array> want = f(x, w);
    const int folds = lazy().folds();
    const std::vector<Array> got = step(x, w);
    // One small direct psum folds once (at the last arrival): three separate ones, three times.
    EXPECT_EQ(lazy().folds() - folds, 1) << "the three psums did not run as one collective";
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(i);
      expect_same_bits(got[i], want[i]);
      EXPECT_EQ(got[i].sharding(), want[i].sharding());
    }
  }
}

}  // namespace
}  // namespace meshrt

namespace meshrt {
namespace {

struct Mlp {
  Array w1, b1, w2, b2, w3;
};
MESHRT_TREE(Mlp, w1, b1, w2, b2, w3);

// A jitted data-parallel MLP step on the stand-in, fusing what it is asked to: checks that the step
// gives eager's bits every round and returns its program's text.
std::string fused_mlp_step_text(bool pairs, bool epilogues, bool drelu = false) {
  test::LazyDevices& fake = lazy();
  fake.set_fuses_pairs(pairs);
  fake.set_fuses_matmul_bias(epilogues);
  fake.set_fuses_matmul_drelu(drelu);
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  const NamedSharding dp(mesh, P("x")), rep(mesh, P());
  auto loss = [](const Mlp& p, const Array& x) {
    const Array h1 = relu(matmul(x, p.w1) + p.b1);
    const Array h2 = relu(matmul(h1, p.w2) + p.b2);
    const Array out = matmul(h2, p.w3);
    return mean(out * out);
  };
  auto vg = value_and_grad(loss);
  auto step = jit([vg](const Mlp& p, const Array& x) { return vg(p, x); });
  Mlp p{device_put(iota(8 * 16, -0.4f, 0.007f), {8, 16}, rep),
        device_put(iota(16, -0.1f, 0.013f), {16}, rep),
        device_put(iota(16 * 16, 0.3f, -0.003f), {16, 16}, rep),
        device_put(iota(16, 0.05f, -0.011f), {16}, rep),
        device_put(iota(16 * 4, -0.2f, 0.009f), {16, 4}, rep)};
  for (int round = 0; round < 3; ++round) {
    const Array x = device_put(iota(32 * 8, -1.0f + 0.1f * round, 0.01f), {32, 8}, dp);
    auto want = vg(p, x);
    auto got = step(p, x);
    expect_same_bits(std::get<0>(got), std::get<0>(want));
    expect_same_bits(std::get<1>(got).w1, std::get<1>(want).w1);
    expect_same_bits(std::get<1>(got).b1, std::get<1>(want).b1);
    expect_same_bits(std::get<1>(got).w2, std::get<1>(want).w2);
    expect_same_bits(std::get<1>(got).b2, std::get<1>(want).b2);
    expect_same_bits(std::get<1>(got).w3, std::get<1>(want).w3);
    p.w1 = p.w1 - 0.1 * std::get<1>(got).w1;
  }
  const Array x = device_put(iota(32 * 8, 0.f, 0.01f), {32, 8}, dp);
  std::string text = step.lower(p, x).as_text();
  fake.set_fuses_pairs(false);
  fake.set_fuses_matmul_bias(false);
  fake.set_fuses_matmul_drelu(false);
  return text;
}

// Where the platform fuses (cuda does; the stand-in here when asked), a jitted data-parallel MLP
// step's bias adds with their relus and relu's gradients (a comparison only a select reads) run
// as fused pairs, and the step still gives eager's bits.
TEST(JitOnADevicePlatform, FusesBiasReluAndReluGradientPairsWithEagerBits) {
  const std::string text = fused_mlp_step_text(true, false);
  // Two bias adds with their relus; relu's gradient of the second layer (the first layer's is
  // not needed: x has no gradient, but h1's relu gradient feeds w1's).
  EXPECT_NE(text.find("fused: 4 kernel calls are fused"), std::string::npos) << text;
  EXPECT_EQ(text.find("products carry"), std::string::npos) << text;
}

// Where the platform also fuses products with their epilogue (Backend::fuses_matmul_bias; the
// stand-in here when asked), jit merges each layer's product, bias add and relu steps into one
// matmul_bias call, and the step still gives eager's bits (the default runs the same kernels).
TEST(JitOnADevicePlatform, FusesALayersProductBiasAndReluWithEagerBits) {
  const std::string text = fused_mlp_step_text(true, true);
  EXPECT_NE(text.find("fused: 2 products carry their layer's bias add (and relu)"),
            std::string::npos)
      << text;
  // What is left of the pairs: relu's gradients.
  EXPECT_NE(text.find("fused: 2 kernel calls are fused"), std::string::npos) << text;
}

// Where the platform also fuses products with relu's gradient (Backend::fuses_matmul_drelu; the
// stand-in here when asked), the backward's dx product moves past dW's to meet relu's gradient
// (its comparison and select already one compare_select, its zero a scalar constant autodiff
// made), each becomes one matmul_drelu call, and the step still gives eager's bits (the default
// runs the same kernels).
TEST(JitOnADevicePlatform, FusesProductsWithReluGradientsWithEagerBits) {
  const int before = lazy().matmul_drelu_calls();
  const std::string text = fused_mlp_step_text(true, true, true);
  EXPECT_NE(text.find("fused: 2 products carry relu's gradient after them as one call"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("fused: 2 products carry their layer's bias add (and relu)"),
            std::string::npos)
      << text;
  // No pair is left: relu's gradients went into their products.
  EXPECT_EQ(text.find("kernel calls are fused elementwise pairs"), std::string::npos) << text;
  // The jitted step replays its program in rounds 2 and 3 (the first call traces): two layers
  // each, on every device.
  EXPECT_EQ(lazy().matmul_drelu_calls() - before, 2 * 2 * kDevices);
  // Without the bias fusion, the same relu gradients; the bias adds and relus stay pairs.
  const std::string alone = fused_mlp_step_text(true, false, true);
  EXPECT_NE(alone.find("fused: 2 products carry relu's gradient after them as one call"),
            std::string::npos)
      << alone;
  EXPECT_NE(alone.find("fused: 2 kernel calls are fused elementwise pairs"), std::string::npos)
      << alone;
}

// A product moves to meet relu's gradient only: a product whose later reader is a bias add (a
// step between) keeps its place, and the program its steps, with the relu-gradient fusion on or
// off.
TEST(JitOnADevicePlatform, MovesAProductOnlyToMeetReluGradient) {
  test::LazyDevices& fake = lazy();
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  const NamedSharding dp(mesh, P("x")), rep(mesh, P());
  auto f = [](const Array& x, const Array& w, const Array& c, const Array& z) {
    const Array p = matmul(x, w);
    const Array o = sin(z);
    return std::vector<Array>{c + p, o};
  };
  const Array x = device_put(iota(8 * 4, -0.4f, 0.03f), {8, 4}, dp);
  const Array w = device_put(iota(4 * 4, 0.2f, -0.01f), {4, 4}, rep);
  const Array c = device_put(iota(4, 0.1f, 0.2f), {4}, rep);
  const Array z = device_put(iota(8 * 4, 0.0f, 0.1f), {8, 4}, dp);
  auto text = [&](bool drelu) {
    fake.set_fuses_pairs(true);
    fake.set_fuses_matmul_bias(true);
    fake.set_fuses_matmul_drelu(drelu);
    const std::string t = jit(f).lower(x, w, c, z).as_text();
    fake.set_fuses_pairs(false);
    fake.set_fuses_matmul_bias(false);
    fake.set_fuses_matmul_drelu(false);
    return t;
  };
  const std::string off = text(false), on = text(true);
  EXPECT_EQ(on, off);
  EXPECT_EQ(on.find("carry their layer's bias add"), std::string::npos) << on;
}

}  // namespace
}  // namespace meshrt

namespace meshrt {
namespace {

std::vector<std::string> logged(const std::function<Array()>& f) {
  CollectiveLog log;
  {
    auto on = log.record();
    (void)f();
  }
  std::vector<std::string> out;
  for (const auto& e : log.entries()) out.push_back(e.collective);
  return out;
}

// MESHRT_MATMUL_PLACEMENT=auto (the default) keeps jax.jit's placement on a device platform (the
// tensor-parallel step was faster so on an H200) and moves rows where asked (cheapest).
TEST(JitOnADevicePlatform, MatmulPlacementAutoKeepsJaxPlacementOnDevices) {
  lazy();
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  const Array dz =
      device_put(iota(4096 * 64, -1.0f, 0.001f), {4096, 64}, NamedSharding(mesh, P(None, "x")));
  const Array w = device_put(iota(64 * 64, 0.5f, -0.01f), {64, 64}, NamedSharding(mesh, P("x")));
  auto f = [&] { return matmul_transposed(dz, w, false, true); };
  EXPECT_EQ(logged(f), std::vector<std::string>{"all_gather"});
  setenv("MESHRT_MATMUL_PLACEMENT", "cheapest", 1);
  const std::vector<std::string> rows = logged(f);
  unsetenv("MESHRT_MATMUL_PLACEMENT");
  // The product stays in rows until read (MESHRT_KEEP_ROWS, global-view.md).
  EXPECT_EQ(rows, (std::vector<std::string>{"all_to_all", "all_gather"}));
}

// ---- the global view's one-expression layer, relu(matmul(x, W) + b): where the platform fuses a
// product's epilogue (the stand-in, when asked), a product in plain eager code waits for its
// expression's bias and relu, and runs with them as one matmul_bias call per device when first
// read, with the unfused ops' bits.

// Turns the stand-in's epilogue fusion on while it lives.
struct Epilogues {
  Epilogues() { lazy().set_fuses_matmul_bias(true); }
  Epilogues(const Epilogues&) = delete;
  Epilogues& operator=(const Epilogues&) = delete;
  ~Epilogues() { lazy().set_fuses_matmul_bias(false); }
};

struct Layer {
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  Array x = device_put(iota(16 * 8, -0.6f, 0.011f), {16, 8}, NamedSharding(mesh, P("x")));
  Array w = device_put(iota(8 * 12, 0.4f, -0.009f), {8, 12}, NamedSharding(mesh, P()));
  Array b = device_put(iota(12, -0.2f, 0.037f), {12}, NamedSharding(mesh, P()));
};

// matmul_bias calls (and those with relu) made while `f` ran and its result was read.
std::pair<int, int> layer_calls(const std::function<Array()>& f, Array* out = nullptr) {
  const int calls = lazy().matmul_bias_calls(), relus = lazy().matmul_bias_relu_calls();
  Array y = f();
  y.block_until_ready();
  if (out != nullptr) *out = y;
  return {lazy().matmul_bias_calls() - calls, lazy().matmul_bias_relu_calls() - relus};
}

TEST(GlobalLayerOnADevicePlatform, OneExpressionRunsAsOneCallPerDeviceWithTheUnfusedBits) {
  lazy();
  Layer l;
  const Array h = matmul(l.x, l.w);  // named: computed on its own
  const Array want_relu = relu(h + l.b), want = h + l.b;
  const Epilogues on;
  Array got;
  // Nothing runs until something reads the layer.
  const int before = lazy().matmul_bias_calls();
  Array y = relu(matmul(l.x, l.w) + l.b);
  EXPECT_NE(meshrt::detail::pending_launch(y), nullptr);
  EXPECT_EQ(lazy().matmul_bias_calls(), before);
  EXPECT_EQ(y.sharding(), want_relu.sharding());
  expect_same_bits(y, want_relu);
  EXPECT_EQ(lazy().matmul_bias_calls(), before + kDevices);
  EXPECT_EQ(meshrt::detail::pending_launch(y), nullptr);  // ran once; its operands released
  EXPECT_EQ(layer_calls([&] { return relu(matmul(l.x, l.w) + l.b); }, &got),
            std::make_pair(kDevices, kDevices));
  expect_same_bits(got, want_relu);
  EXPECT_EQ(layer_calls([&] { return matmul(l.x, l.w) + l.b; }, &got), std::make_pair(kDevices, 0));
  expect_same_bits(got, want);
  EXPECT_EQ(layer_calls([&] { return l.b + matmul(l.x, l.w); }, &got), std::make_pair(kDevices, 0));
  expect_same_bits(got, want);
  // A (1, n) bias, an operand stored transposed, and the bias itself a product's temporary.
  const Array b2 = reshape(l.b, {1, 12});
  EXPECT_EQ(layer_calls([&] { return relu(b2 + matmul(l.x, l.w)); }, &got),
            std::make_pair(kDevices, kDevices));
  expect_same_bits(got, want_relu);
  const Array wt = transpose(l.w);
  EXPECT_EQ(layer_calls([&] { return relu(matmul_transposed(l.x, wt, false, true) + l.b); }, &got),
            std::make_pair(kDevices, kDevices));
  expect_same_bits(got, relu(matmul_transposed(l.x, wt, false, true) + l.b));
  const Array one = device_put(iota(8, 1.f, 0.f), {1, 8}, NamedSharding(l.mesh, P()));
  EXPECT_EQ(layer_calls([&] { return matmul(l.x, l.w) + matmul(one, l.w); }, &got).first, kDevices);
  expect_same_bits(got, h + matmul(one, l.w));
}

TEST(GlobalLayerOnADevicePlatform, EverythingElseRunsOpByOp) {
  lazy();
  Layer l;
  const Array h = matmul(l.x, l.w);
  Array got;
  // The platform does not fuse epilogues.
  EXPECT_EQ(layer_calls([&] { return relu(matmul(l.x, l.w) + l.b); }, &got), std::make_pair(0, 0));
  expect_same_bits(got, relu(h + l.b));
  const Epilogues on;
  // A named product; no bias; a bias of the whole product's shape; a float64 bias (promotes);
  // a bias that does not broadcast (add's own error, at the add).
  EXPECT_EQ(layer_calls([&] { return relu(h + l.b); }).first, 0);
  EXPECT_EQ(layer_calls([&] { return relu(matmul(l.x, l.w)); }, &got).first, 0);
  expect_same_bits(got, relu(h));
  const Array full_bias =
      device_put(iota(16 * 12, 0.f, 0.01f), {16, 12}, NamedSharding(l.mesh, P()));
  EXPECT_EQ(layer_calls([&] { return matmul(l.x, l.w) + full_bias; }, &got).first, 0);
  expect_same_bits(got, h + full_bias);
  const Array b64 = astype(l.b, DType::f64);
  EXPECT_EQ(layer_calls([&] { return matmul(l.x, l.w) + b64; }, &got).first, 0);
  EXPECT_EQ(got.dtype(), DType::f64);
  const Array b13 = device_put(iota(13, 0.f, 1.f), {13}, NamedSharding(l.mesh, P()));
  EXPECT_THROW((void)(matmul(l.x, l.w) + b13), Error);
  // A second add runs the layer with the first bias, then adds.
  EXPECT_EQ(layer_calls([&] { return matmul(l.x, l.w) + l.b + l.b; }, &got),
            std::make_pair(kDevices, 0));
  expect_same_bits(got, h + l.b + l.b);
  // Traced code runs op by op: value_and_grad records each op for its derivative.
  auto loss = [&](const Array& w) { return sum(relu(matmul(l.x, w) + l.b)); };
  auto vg = value_and_grad(loss);
  std::tuple<Array, Array> fused;
  EXPECT_EQ(layer_calls([&] {
              fused = vg(l.w);
              return std::get<1>(fused);
            }).first,
            0);
  lazy().set_fuses_matmul_bias(false);
  const auto plain = vg(l.w);
  lazy().set_fuses_matmul_bias(true);
  expect_same_bits(std::get<0>(fused), std::get<0>(plain));
  expect_same_bits(std::get<1>(fused), std::get<1>(plain));
}

// A pending layer is an ordinary Array to everything that reads it: values, shards, a jitted
// function (as an argument, donated or not, or a constant), shard_map, value_and_grad (as a
// constant), an op on another thread.
TEST(GlobalLayerOnADevicePlatform, APendingLayerReadsAsAnyArray) {
  lazy();
  Layer l;
  const Array want = relu(matmul(l.x, l.w) + l.b);
  const Epilogues on;
  auto layer = [&] { return relu(matmul(l.x, l.w) + l.b); };
  {
    Array y = layer();
    std::vector<Shard> shards = y.addressable_shards();
    ASSERT_EQ(shards.size(), static_cast<size_t>(kDevices));
    EXPECT_EQ(shards[1].data.shape(), (Shape{4, 12}));
    expect_same_bits(y, want);
  }
  {
    Array y = layer();
    y.block_until_ready();
    EXPECT_NE(y.str().find("float32(16, 12)"), std::string::npos) << y.str();
    expect_same_bits(y, want);
  }
  auto f = jit([](const Array& a, const Array& w2) { return sum(matmul(a, w2) * 2.0); });
  const Array w2 = device_put(iota(12 * 3, 0.1f, 0.01f), {12, 3}, NamedSharding(l.mesh, P()));
  const Array want_f = sum(matmul(want, w2) * 2.0);
  for (int round = 0; round < 2; ++round) expect_same_bits(f(layer(), w2), want_f);
  auto g = jit([](const Array& a) { return a * 3.0; }, {.donate_argnums = {0}});
  Array donated = layer();
  expect_same_bits(g(donated), want * 3.0);
  EXPECT_FALSE(donated.valid());
  // A constant first read by jit's trace is a constant there, as any Array (the layer's launch is
  // not one of the program's steps).
  const Array constant = layer();
  auto h = jit([&constant](const Array& w3) { return matmul(constant, w3); });
  auto h_plain = jit([&want](const Array& w3) { return matmul(want, w3); });
  EXPECT_EQ(h.lower(w2).as_text(), h_plain.lower(w2).as_text());
  expect_same_bits(h(w2), matmul(want, w2));
  const Array in_body = layer();
  auto summed = shard_map([](Context& ctx, const Tensor& t) { return ctx.psum(sum(t, 0), "x"); },
                          l.mesh, {P("x")}, P());
  expect_same_bits(summed(in_body), sum(want, 0));
  // A layer of large blocks (which run on every device at once when computed op by op), first
  // read inside a shard_map body.
  const Array big_x =
      device_put(iota(4096 * 512, -1.f, 1e-6f), {4096, 512}, NamedSharding(l.mesh, P("x")));
  const Array big_w =
      device_put(iota(512 * 64, 0.5f, -3e-5f), {512, 64}, NamedSharding(l.mesh, P()));
  const Array big_b = device_put(iota(64, 0.1f, 0.01f), {64}, NamedSharding(l.mesh, P()));
  const Array big = relu(matmul(big_x, big_w) + big_b);
  float first = 0.f;
  auto peek = shard_map(
      [&big, &first](Context&, const Tensor& t) {
        if (t.device().local_index() == 0) first = big.to_vector<float>()[0];
        return t;
      },
      l.mesh, {P("x")}, P("x"));
  (void)peek(l.x);
  lazy().set_fuses_matmul_bias(false);
  const Array big_want = relu(matmul(big_x, big_w) + big_b);
  lazy().set_fuses_matmul_bias(true);
  EXPECT_EQ(first, big_want.to_vector<float>()[0]);
  expect_same_bits(big, big_want);
  const Array outside = layer();
  auto vg = value_and_grad([&outside](const Array& w3) { return sum(matmul(outside, w3)); });
  const auto [v, grad] = vg(w2);
  expect_same_bits(v, sum(matmul(want, w2)));
  expect_same_bits(
      grad, matmul_transposed(want, ones({16, 3}, DType::f32, NamedSharding(l.mesh, P("x"))), true,
                              false));
  const Array shared = layer();
  std::vector<std::thread> readers;
  std::vector<std::vector<float>> seen(4);
  for (size_t i = 0; i < seen.size(); ++i) {
    readers.emplace_back([&, i] { seen[i] = (shared * 1.0).to_vector<float>(); });
  }
  for (std::thread& t : readers) t.join();
  for (const std::vector<float>& s : seen) EXPECT_EQ(s, want.to_vector<float>());
}

// Every reshard the layer needs is the one the ops one by one make, logged at the op that needs
// it: a column-sharded product takes its bias's columns in place, a row-sharded one gathers a
// sharded bias.
TEST(GlobalLayerOnADevicePlatform, PlacesAndLogsAsTheOpsOneByOne) {
  lazy();
  Layer l;
  const Array xr = device_put(iota(16 * 8, -0.6f, 0.011f), {16, 8}, NamedSharding(l.mesh, P()));
  const Array wc =
      device_put(iota(8 * 12, 0.4f, -0.009f), {8, 12}, NamedSharding(l.mesh, P(None, "x")));
  const Array bc = device_put(iota(12, -0.2f, 0.037f), {12}, NamedSharding(l.mesh, P("x")));
  auto columns = [&] { return relu(matmul(xr, wc) + bc); };
  auto gathered = [&] { return relu(matmul(l.x, l.w) + bc); };
  auto rows_of_w = [&] { return relu(matmul(l.x, wc) + l.b); };
  const std::vector<std::string> want_columns = logged(columns), want_gathered = logged(gathered),
                                 want_rows = logged(rows_of_w);
  const Array c0 = columns(), g0 = gathered(), r0 = rows_of_w();
  const Epilogues on;
  EXPECT_EQ(logged(columns), want_columns);
  EXPECT_EQ(logged(gathered), want_gathered);
  EXPECT_EQ(logged(rows_of_w), want_rows);
  EXPECT_EQ(want_gathered, std::vector<std::string>{"all_gather"});
  Array got;
  EXPECT_EQ(layer_calls(columns, &got).first, kDevices);
  EXPECT_EQ(got.sharding(), c0.sharding());
  expect_same_bits(got, c0);
  EXPECT_EQ(layer_calls(gathered, &got).first, kDevices);
  expect_same_bits(got, g0);
  EXPECT_EQ(layer_calls(rows_of_w, &got).first, kDevices);
  EXPECT_EQ(got.sharding(), r0.sharding());
  expect_same_bits(got, r0);
}

// Explicit sharding mode while it lives.
struct Strict {
  Strict() { set_sharding_mode(ShardingMode::explicit_); }
  Strict(const Strict&) = delete;
  Strict& operator=(const Strict&) = delete;
  ~Strict() { set_sharding_mode(ShardingMode::auto_); }
};

// The layer's add takes its operands in the caller's order, as add does: where the placement
// rule breaks a tie by order (a one-row product and a bias of as many elements), the result's
// sharding, the CollectiveLog and explicit mode's error are those of the ops one by one (b first:
// the product moves to b's sharding, so it is no layer's; the product first: the layer).
TEST(GlobalLayerOnADevicePlatform, TheAddKeepsItsOperandsOrder) {
  lazy();
  Mesh mesh = make_mesh({2, 2}, {"x", "y"}, "cuda");
  const Array x = device_put(iota(8, 0.5f, -0.1f), {1, 8}, NamedSharding(mesh, P()));
  const Array w = device_put(iota(64, -0.3f, 0.01f), {8, 8}, NamedSharding(mesh, P(None, "x")));
  const Array b = device_put(iota(8, 0.2f, 0.03f), {8}, NamedSharding(mesh, P("y")));
  auto first = [&] { return b + matmul(x, w); };
  auto second = [&] { return matmul(x, w) + b; };
  auto both = [&] { return relu(matmul(x, w) + matmul(x, w)); };
  const Array want_first = first(), want_second = second(), want_both = both();
  const std::vector<std::string> log_first = logged(first), log_second = logged(second),
                                 log_both = logged(both);
  std::string error_first, error_second;
  {
    const Strict strict;
    try {
      (void)first();
    } catch (const Error& e) {
      error_first = e.what();
    }
    try {
      (void)second();
    } catch (const Error& e) {
      error_second = e.what();
    }
  }
  ASSERT_NE(error_first, "");
  const Epilogues on;
  Array got;
  // b first: the tie goes to b's sharding, the product moves, so the add runs on its own.
  EXPECT_EQ(layer_calls(first, &got).first, 0);
  EXPECT_EQ(got.sharding(), want_first.sharding()) << got.str() << " " << want_first.str();
  expect_same_bits(got, want_first);
  EXPECT_EQ(layer_calls(second, &got).first, 4);
  EXPECT_EQ(got.sharding(), want_second.sharding());
  expect_same_bits(got, want_second);
  (void)layer_calls(both, &got);
  EXPECT_EQ(got.sharding(), want_both.sharding());
  expect_same_bits(got, want_both);
  EXPECT_EQ(logged(first), log_first);
  EXPECT_EQ(logged(second), log_second);
  EXPECT_EQ(logged(both), log_both);
  const Strict strict;
  const std::vector<std::pair<std::function<Array()>, std::string>> cases = {
      {first, error_first}, {second, error_second}};
  for (const auto& [f, want] : cases) {
    try {
      (void)f().block_until_ready();
      ADD_FAILURE() << "no error; op by op: " << want;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
  }
}

// A layer never waits on another: planning a product runs a pending operand (its expression has
// ended), so a long chain of layers neither recurses when read nor when freed.
TEST(GlobalLayerOnADevicePlatform, ALayerNeverWaitsOnAnother) {
  lazy();
  Layer l;
  const Array w2 = device_put(iota(12 * 12, 0.05f, -0.001f), {12, 12}, NamedSharding(l.mesh, P()));
  const Array want1 = relu(matmul(l.x, l.w) + l.b), want2 = relu(matmul(want1, w2) + l.b);
  const Epilogues on;
  const Array h1 = relu(matmul(l.x, l.w) + l.b);
  EXPECT_NE(meshrt::detail::pending_launch(h1), nullptr);
  const Array h2 = relu(matmul(h1, w2) + l.b);
  EXPECT_EQ(meshrt::detail::pending_launch(h1), nullptr);
  EXPECT_NE(meshrt::detail::pending_launch(h2), nullptr);
  expect_same_bits(h2, want2);
  expect_same_bits(h1, want1);
  // And a pending bias runs when the add takes it.
  const Array bias =
      matmul(device_put(iota(12, 0.f, 0.01f), {1, 12}, NamedSharding(l.mesh, P())), w2);
  EXPECT_NE(meshrt::detail::pending_launch(bias), nullptr);
  const Array z = matmul(h2, w2) + bias;
  EXPECT_EQ(meshrt::detail::pending_launch(bias), nullptr);
  Array h = h2;
  for (int i = 0; i < 20000; ++i) h = relu(matmul(h, w2) + l.b);
  EXPECT_EQ(h.to_vector<float>().size(), 16u * 12u);
}

}  // namespace
}  // namespace meshrt
