// The kernel tape (runtime/detail/kernel_tape.h): a device-local function's kernels recorded once
// and replayed on other operands bit for bit; what it refuses to record, and why.
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "runtime/detail/kernel_tape.h"
#include "runtime/detail/platform.h"

using namespace meshrt;
using detail::KernelProgram;
using detail::KernelRecord;
using detail::record_kernels;

namespace {

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

Tensor vec(std::vector<float> v, Shape shape, int device = 0) {
  return tensor(v, std::move(shape), devices()[static_cast<size_t>(device)]);
}

std::vector<float> ramp(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = offset + scale * static_cast<float>(i % 13);
  return v;
}

// Runs `p` on `operands` (fresh temporaries) and returns its results' bytes.
std::vector<std::vector<char>> run(const KernelProgram& p, const std::vector<Tensor>& operands) {
  const Device d = operands.front().device();
  backend::Backend& be = detail::backend_of(d);
  std::vector<std::shared_ptr<backend::Buffer>> temps;
  std::vector<char*> base;
  for (const Tensor& t : operands) base.push_back(static_cast<char*>(t.data()));
  for (size_t bytes : p.temp_bytes) {
    temps.push_back(be.allocate(d.local_index(), bytes));
    base.push_back(static_cast<char*>(temps.back()->data()));
  }
  std::vector<backend::Strided> scratch = p.make_scratch();
  p.run(be, d.local_index(), base.data(), scratch);
  std::vector<std::vector<char>> out;
  for (size_t r = 0; r < p.results.size(); ++r) {
    const char* at = base[static_cast<size_t>(p.results[r].slot)] + p.results[r].offset;
    const size_t bytes =
        static_cast<size_t>(shape_size(p.result_shapes[r])) * dtype_size(p.result_dtypes[r]);
    out.emplace_back(at, at + bytes);
  }
  return out;
}

// Expects `p`, run on `ops`, to give fn(ops)'s results bit for bit.
void expect_runs_as(const KernelProgram& p, const Fn& fn, const std::vector<Tensor>& ops) {
  const std::vector<Tensor> want = fn(ops);
  const std::vector<std::vector<char>> got = run(p, ops);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].nbytes());
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), got[i].size())) << "result " << i;
  }
}

void expect_reproduces(const Fn& fn, const std::vector<Tensor>& traced,
                       const std::vector<Tensor>& other) {
  KernelRecord r = record_kernels(fn, traced);
  ASSERT_NE(r.program, nullptr) << r.why_not;
  std::vector<Tensor> want = fn(other);
  std::vector<std::vector<char>> got = run(*r.program, other);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(r.program->result_shapes[i], want[i].shape());
    EXPECT_EQ(r.program->result_dtypes[i], want[i].dtype());
    ASSERT_EQ(got[i].size(), want[i].nbytes());
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), got[i].size())) << "result " << i;
  }
}

TEST(KernelTape, ScalarsBroadcastsAndReductionsReplayOnOtherOperands) {
  Fn fn = [](const std::vector<Tensor>& t) {
    Tensor a = t[0] * 2.5 + t[1];                    // scalar fill, then broadcast add
    Tensor b = exp(a - max(a, 1, true));             // keepdims reduction, broadcast back
    Tensor c = astype(sum(b, 0), DType::f64) / 3.0;  // cast, reduce, weak-typed scalar
    return std::vector<Tensor>{b, c, mean(t[0])};
  };
  expect_reproduces(fn, {vec(ramp(12, 0.5f, -2.0f), {3, 4}), vec(ramp(4, 1.0f, 0.25f), {4})},
                    {vec(ramp(12, -0.75f, 3.0f), {3, 4}), vec(ramp(4, 0.125f, -1.0f), {4})});
}

TEST(KernelTape, MatmulSelectAndComparisonsReplayOnOtherOperands) {
  Fn fn = [](const std::vector<Tensor>& t) {
    Tensor h = matmul(t[0], t[1]);
    Tensor r = where(h > 0.0, h, h * 0.01);
    return std::vector<Tensor>{r, argmax(r, 1), h < 1.0};
  };
  expect_reproduces(fn,
                    {vec(ramp(6 * 5, 0.3f, -2.0f), {6, 5}), vec(ramp(5 * 7, -0.2f, 1.0f), {5, 7})},
                    {vec(ramp(6 * 5, -0.4f, 1.5f), {6, 5}), vec(ramp(5 * 7, 0.7f, -3.0f), {5, 7})});
}

TEST(KernelTape, SlicesAndConcatenationsCopyInsideTheDevice) {
  Fn fn = [](const std::vector<Tensor>& t) {
    Tensor s = slice(t[0], {1, 0}, {3, 4});
    return std::vector<Tensor>{concatenate({s, t[0]}, 0) + 1.0};
  };
  expect_reproduces(fn, {vec(ramp(16, 0.5f, 0.0f), {4, 4})}, {vec(ramp(16, -1.5f, 2.0f), {4, 4})});
}

// Recordings without any fusion (MESHRT_JIT_FUSION=0) while it lives: the tests of one fusion
// pass run it on the kernels as recorded.
class Unfused {
 public:
  Unfused() { setenv("MESHRT_JIT_FUSION", "0", 1); }
  Unfused(const Unfused&) = delete;
  Unfused& operator=(const Unfused&) = delete;
  ~Unfused() { unsetenv("MESHRT_JIT_FUSION"); }
};

int count_kind(const KernelProgram& p, detail::KernelCall::Kind k) {
  int n = 0;
  for (const detail::KernelCall& c : p.calls) n += c.kind == k ? 1 : 0;
  return n;
}

// A dense layer's forward (bias add, relu) and relu's gradient (a comparison only a select reads)
// become one call each, which the recording checks gives fn's bits; replayed on other operands,
// they equal fn bit for bit.
TEST(KernelTape, FusesBiasReluAndReluGradientPairs) {
  using K = detail::KernelCall::Kind;
  Fn fn = [](const std::vector<Tensor>& t) {
    Tensor y = relu(matmul(t[0], t[1]) + t[2]);
    Tensor dz = where(y > 0.0, t[3], t[3] * 0.0);
    return std::vector<Tensor>{y, matmul_transposed(t[0], dz, true, false)};
  };
  const std::vector<Tensor> a = {
      vec(ramp(6 * 5, 0.3f, -2.0f), {6, 5}), vec(ramp(5 * 7, -0.2f, 1.0f), {5, 7}),
      vec(ramp(7, 0.5f, -1.0f), {7}), vec(ramp(42, 0.7f, -3.0f), {6, 7})};
  const std::vector<Tensor> b = {
      vec(ramp(6 * 5, -0.4f, 1.5f), {6, 5}), vec(ramp(5 * 7, 0.7f, -3.0f), {5, 7}),
      vec(ramp(7, -0.25f, 0.5f), {7}), vec(ramp(42, 0.1f, 1.0f), {6, 7})};
  const Unfused unfused;
  KernelRecord r = record_kernels(fn, a);
  ASSERT_NE(r.program, nullptr) << r.why_not;
  // cpu fuses chains, not pairs: the pass runs on a copy of the unfused recording here (the
  // backend's defaults run a fused call as its two kernels).
  EXPECT_EQ(count_kind(*r.program, K::binary_unary), 0);
  KernelProgram fused = *r.program;
  EXPECT_EQ(detail::fuse_elementwise_pairs(fused), 2);
  EXPECT_EQ(count_kind(fused, K::binary_unary), 1);
  EXPECT_EQ(count_kind(fused, K::compare_select), 1);
  EXPECT_EQ(count_kind(fused, K::select), 0);
  EXPECT_EQ(fused.calls.size() + 2, r.program->calls.size());
  for (const auto& ops : {a, b}) expect_runs_as(fused, fn, ops);
}

// Pairs whose intermediate something else needs stay apart: a result, or a second reader.
TEST(KernelTape, KeepsPairsWhoseIntermediateIsNeeded) {
  using K = detail::KernelCall::Kind;
  Fn result = [](const std::vector<Tensor>& t) {
    Tensor z = t[0] + t[1];
    return std::vector<Tensor>{z, relu(z)};
  };
  Fn two_readers = [](const std::vector<Tensor>& t) {
    Tensor z = t[0] + t[1];
    return std::vector<Tensor>{relu(z) * z};
  };
  const std::vector<Tensor> ops = {vec(ramp(12, 0.5f, -2.0f), {3, 4}),
                                   vec(ramp(12, -0.25f, 1.0f), {3, 4})};
  const Unfused unfused;
  for (const Fn& fn : {result, two_readers}) {
    KernelRecord r = record_kernels(fn, ops);
    ASSERT_NE(r.program, nullptr) << r.why_not;
    KernelProgram p = *r.program;
    EXPECT_EQ(detail::fuse_elementwise_pairs(p), 0);
    EXPECT_EQ(count_kind(p, K::binary_unary), 0);
    EXPECT_EQ(count_kind(p, K::unary), 1);
  }
}

// A dense layer's product with its bias add, and with relu after it, become one matmul_bias
// call, whether the add and relu are already a fused pair or not, the bias on either side of the
// add, either operand read transposed; the backend's default runs it as the kernels it replaces,
// so replayed on other operands it equals fn bit for bit.
TEST(KernelTape, FusesProductsWithTheirBiasAddAndRelu) {
  using K = detail::KernelCall::Kind;
  struct Case {
    const char* what;
    Fn fn;
    bool pairs_first;  // fuse_elementwise_pairs runs first (as record_kernels does on cuda)
    int fusions;       // calls fuse_matmul_epilogues fuses away
    int relu;          // the fused call's op2
  };
  const std::vector<Case> cases = {
      {"relu(x @ w + b)",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{relu(matmul(t[0], t[1]) + t[2])};
       },
       true, 1, 1},
      {"relu(x @ w + b), unpaired",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{relu(matmul(t[0], t[1]) + t[2])};
       },
       false, 2, 1},
      {"x @ w + b",
       [](const std::vector<Tensor>& t) { return std::vector<Tensor>{matmul(t[0], t[1]) + t[2]}; },
       true, 1, 0},
      {"b + x @ w",
       [](const std::vector<Tensor>& t) { return std::vector<Tensor>{t[2] + matmul(t[0], t[1])}; },
       true, 1, 0},
      {"relu(x @ w^T + b), w stored transposed",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{
             relu(matmul_transposed(t[0], transpose(t[1]), false, true) + t[2])};
       },
       true, 1, 1},
  };
  const std::vector<Tensor> a = {vec(ramp(6 * 5, 0.3f, -2.0f), {6, 5}),
                                 vec(ramp(5 * 7, -0.2f, 1.0f), {5, 7}),
                                 vec(ramp(7, 0.5f, -1.0f), {7})};
  const std::vector<Tensor> b = {vec(ramp(6 * 5, -0.4f, 1.5f), {6, 5}),
                                 vec(ramp(5 * 7, 0.7f, -3.0f), {5, 7}),
                                 vec(ramp(7, -0.25f, 0.5f), {7})};
  const Unfused unfused;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    KernelRecord r = record_kernels(c.fn, a);
    ASSERT_NE(r.program, nullptr) << r.why_not;
    // cpu does not fuse epilogues, and the recording here fuses nothing: the passes run on a
    // copy.
    EXPECT_EQ(count_kind(*r.program, K::matmul_bias), 0);
    KernelProgram fused = *r.program;
    if (c.pairs_first) (void)detail::fuse_elementwise_pairs(fused);
    const size_t before = fused.calls.size();
    EXPECT_EQ(detail::fuse_matmul_epilogues(fused), c.fusions);
    EXPECT_EQ(fused.calls.size() + static_cast<size_t>(c.fusions), before);
    ASSERT_EQ(count_kind(fused, K::matmul_bias), 1);
    EXPECT_EQ(count_kind(fused, K::matmul), 0);
    for (const detail::KernelCall& call : fused.calls) {
      if (call.kind == K::matmul_bias) EXPECT_EQ(call.op2, c.relu);
    }
    for (const auto& ops : {a, b}) expect_runs_as(fused, c.fn, ops);
  }
}

// relu's gradient after a product, as autodiff writes it (where(y > 0, g @ W^T, 0), its zero a
// scalar), becomes one matmul_drelu call reading y, whether the comparison and select are apart or
// already one compare_select, the zero a fill or an operand jit knows, either operand transposed;
// the comparison left without a reader goes. The backend's default runs it as the kernels it
// replaces, so replayed on other operands it equals fn bit for bit.
TEST(KernelTape, FusesProductsWithReluGradientAfterThem) {
  using K = detail::KernelCall::Kind;
  auto zero = [](const Tensor& t) { return full({}, 0.0, DType::f32, t.device()); };
  struct Case {
    const char* what;
    Fn fn;
    bool pairs_first;  // fuse_elementwise_pairs runs first (as record_kernels does on cuda)
    int fusions;       // calls fuse_relu_gradients fuses away
  };
  const std::vector<Case> cases = {
      {"where(y > 0, g @ w^T, 0)",
       [&](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{
             where(t[0] > 0.0, matmul_transposed(t[1], t[2], false, true), zero(t[1]))};
       },
       false, 2},
      {"the same as a compare_select",
       [&](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{
             where(t[0] > 0.0, matmul_transposed(t[1], t[2], false, true), zero(t[1]))};
       },
       true, 1},
      {"the comparison first, g @ w with w stored transposed twice over",
       [&](const std::vector<Tensor>& t) {
         const Tensor c = t[0] > 0.0;
         return std::vector<Tensor>{
             where(c, matmul_transposed(t[1], transpose(t[2]), false, false), zero(t[1]))};
       },
       false, 2},
  };
  const std::vector<Tensor> a = {
      vec({1, -2, 0, 3, std::numeric_limits<float>::quiet_NaN(), 0.5, -0.0f, 2, -1, 4, 0, 1},
          {3, 4}),
      vec(ramp(3 * 5, 0.3f, -2.0f), {3, 5}), vec(ramp(4 * 5, -0.2f, 1.0f), {4, 5})};
  std::vector<float> g = ramp(3 * 5, -0.4f, 1.5f);
  g[2] = std::numeric_limits<float>::infinity();
  g[7] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Tensor> b = {vec({0, 2, -1, 1, 1, 0, 3, -0.5, 2, 2, -2, 0.25}, {3, 4}),
                                 vec(g, {3, 5}), vec(ramp(4 * 5, 0.7f, -3.0f), {4, 5})};
  const Unfused unfused;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    KernelRecord r = record_kernels(c.fn, a);
    ASSERT_NE(r.program, nullptr) << r.why_not;
    EXPECT_EQ(count_kind(*r.program, K::matmul_drelu), 0);  // cpu fuses no product
    KernelProgram fused = *r.program;
    if (c.pairs_first) (void)detail::fuse_elementwise_pairs(fused);
    const size_t before = fused.calls.size();
    EXPECT_EQ(detail::fuse_relu_gradients(fused), c.fusions);
    ASSERT_EQ(count_kind(fused, K::matmul_drelu), 1);
    EXPECT_EQ(count_kind(fused, K::matmul), 0);
    EXPECT_EQ(count_kind(fused, K::select) + count_kind(fused, K::compare_select), 0);
    EXPECT_EQ(count_kind(fused, K::binary), 0);  // the comparison went
    // The zeros' fills no call reads any more went too.
    EXPECT_EQ(count_kind(fused, K::fill), 0);
    EXPECT_LE(fused.calls.size() + static_cast<size_t>(c.fusions), before);
    for (const auto& ops : {a, b}) expect_runs_as(fused, c.fn, ops);
  }
}

// The zero as an operand (jit's constant): fused only where the program knows it is +0.0
// (KernelProgram::operand_scalars).
TEST(KernelTape, ReluGradientsZeroOperandMustBeAKnownPlusZero) {
  using K = detail::KernelCall::Kind;
  Fn fn = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{where(t[0] > 0.0, matmul(t[1], t[2]), t[3])};
  };
  const std::vector<Tensor> ops = {vec({1, -2, 0, 3, 2, -1}, {2, 3}),
                                   vec(ramp(2 * 4, 0.3f, -2.0f), {2, 4}),
                                   vec(ramp(4 * 3, -0.2f, 1.0f), {4, 3}), vec({0.0f}, {})};
  const Unfused unfused;
  KernelRecord r = record_kernels(fn, ops);
  ASSERT_NE(r.program, nullptr) << r.why_not;
  struct Known {
    const char* what;
    std::vector<std::optional<double>> scalars;
    int fusions;
  };
  const std::vector<Known> cases = {
      {"unknown", {}, 0},
      {"known +0", {std::nullopt, std::nullopt, std::nullopt, 0.0}, 2},
      {"known -0", {std::nullopt, std::nullopt, std::nullopt, -0.0}, 0},
      {"known 1", {std::nullopt, std::nullopt, std::nullopt, 1.0}, 0},
  };
  for (const Known& k : cases) {
    SCOPED_TRACE(k.what);
    KernelProgram p = *r.program;
    p.operand_scalars = k.scalars;
    EXPECT_EQ(detail::fuse_relu_gradients(p), k.fusions);
    EXPECT_EQ(count_kind(p, K::matmul_drelu), k.fusions > 0 ? 1 : 0);
    if (k.fusions > 0) expect_runs_as(p, fn, ops);
  }
}

// Anything but relu's gradient after a product whose result nothing else reads stays apart.
TEST(KernelTape, KeepsProductsThatAreNotFollowedByReluGradient) {
  using K = detail::KernelCall::Kind;
  auto scalar = [](const Tensor& t, double v) { return full({}, v, DType::f32, t.device()); };
  const std::vector<std::pair<const char*, Fn>> cases = {
      {"the else branch is not zero",
       [&](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{where(t[0] > 0.0, matmul(t[1], t[2]), scalar(t[1], 0.5))};
       }},
      {"the else branch is -0",
       [&](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{where(t[0] > 0.0, matmul(t[1], t[2]), scalar(t[1], -0.0))};
       }},
      {"y >= 0",
       [&](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{where(t[0] >= 0.0, matmul(t[1], t[2]), scalar(t[1], 0.0))};
       }},
      {"y > 1",
       [&](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{where(t[0] > 1.0, matmul(t[1], t[2]), scalar(t[1], 0.0))};
       }},
      {"the product in the else branch",
       [&](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{where(t[0] > 0.0, scalar(t[1], 0.0), matmul(t[1], t[2]))};
       }},
      {"the product is a result too",
       [&](const std::vector<Tensor>& t) {
         const Tensor g = matmul(t[1], t[2]);
         return std::vector<Tensor>{g, where(t[0] > 0.0, g, scalar(t[1], 0.0))};
       }},
      {"the comparison is a result too",
       [&](const std::vector<Tensor>& t) {
         const Tensor c = t[0] > 0.0;
         return std::vector<Tensor>{c, where(c, matmul(t[1], t[2]), scalar(t[1], 0.0))};
       }},
      {"the comparison has another reader",
       [&](const std::vector<Tensor>& t) {
         const Tensor c = t[0] > 0.0;
         return std::vector<Tensor>{where(c, matmul(t[1], t[2]), scalar(t[1], 0.0)),
                                    where(c, t[0], scalar(t[1], 0.0))};
       }},
      {"y is broadcast",
       [&](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{where(t[3] > 0.0, matmul(t[1], t[2]), scalar(t[1], 0.0))};
       }},
  };
  const std::vector<Tensor> ops = {vec({1, -2, 0, 3, 2, -1}, {2, 3}),
                                   vec(ramp(2 * 4, 0.3f, -2.0f), {2, 4}),
                                   vec(ramp(4 * 3, -0.2f, 1.0f), {4, 3}), vec({1, -1, 2}, {3})};
  const Unfused unfused;
  for (const auto& [what, fn] : cases) {
    SCOPED_TRACE(what);
    KernelRecord r = record_kernels(fn, ops);
    ASSERT_NE(r.program, nullptr) << r.why_not;
    for (const bool pairs : {false, true}) {
      KernelProgram p = *r.program;
      if (pairs) (void)detail::fuse_elementwise_pairs(p);
      EXPECT_EQ(detail::fuse_relu_gradients(p), 0);
      EXPECT_EQ(count_kind(p, K::matmul_drelu), 0);
    }
  }
}

// Products whose result something else needs, or whose add is not a layer's bias, stay apart.
TEST(KernelTape, KeepsProductsThatAreNotALayersBiasAdd) {
  using K = detail::KernelCall::Kind;
  const std::vector<std::pair<const char*, Fn>> cases = {
      {"the product is a result",
       [](const std::vector<Tensor>& t) {
         Tensor z = matmul(t[0], t[1]);
         return std::vector<Tensor>{z, z + t[2]};
       }},
      {"the product is read twice",
       [](const std::vector<Tensor>& t) {
         Tensor z = matmul(t[0], t[1]);
         return std::vector<Tensor>{(z + t[2]) * z};
       }},
      {"a column added, not a row",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{matmul(t[0], t[1]) + reshape(slice(t[2], {0}, {6}), {6, 1})};
       }},
      {"a whole matrix added",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{matmul(t[0], t[1]) + matmul(t[0], t[1])};
       }},
      {"the bias subtracted",
       [](const std::vector<Tensor>& t) { return std::vector<Tensor>{matmul(t[0], t[1]) - t[2]}; }},
      {"a float64 product",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{matmul(astype(t[0], DType::f64), astype(t[1], DType::f64)) +
                                    astype(t[2], DType::f64)};
       }},
      {"a batch of products",
       [](const std::vector<Tensor>& t) {
         Tensor x = reshape(concatenate({t[0], t[0]}), {2, 6, 5});
         Tensor w = reshape(concatenate({t[1], t[1]}), {2, 5, 7});
         return std::vector<Tensor>{matmul(x, w) + t[2]};
       }},
  };
  const std::vector<Tensor> ops = {vec(ramp(6 * 5, 0.3f, -2.0f), {6, 5}),
                                   vec(ramp(5 * 7, -0.2f, 1.0f), {5, 7}),
                                   vec(ramp(7, 0.5f, -1.0f), {7})};
  const Unfused unfused;
  for (const auto& [what, fn] : cases) {
    SCOPED_TRACE(what);
    KernelRecord r = record_kernels(fn, ops);
    ASSERT_NE(r.program, nullptr) << r.why_not;
    KernelProgram p = *r.program;
    (void)detail::fuse_elementwise_pairs(p);
    EXPECT_EQ(detail::fuse_matmul_epilogues(p), 0);
    EXPECT_EQ(count_kind(p, K::matmul_bias), 0);
  }
}

// Chains of elementwise kernels become one call each on cpu (a cache-sized tile at a time), kept
// by the recording only with fn's bits, and give fn's bits on other operands too: float32,
// float64, bfloat16 casts, int32 wraparound, bool intermediates, broadcasts, a transposed read,
// tiles that split rows and the last dimension, a rank-0 chain, NaN and infinities.
TEST(KernelTape, FusesElementwiseChainsWithTheKernelsBits) {
  using K = detail::KernelCall::Kind;
  struct Case {
    const char* what;
    Fn fn;
    std::vector<Shape> shapes;  // the operands'
    int chains;                 // chain calls in the recording
    int unfused_calls;          // elementwise calls the chains replace
    int constants;              // scalar literals the chains hold (their fills dropped)
    int outputs = -1;           // the chains' outputs, all told (-1: one per chain)
  };
  const std::vector<Case> cases = {
      {"adam's update (three results; the moments are results, read again by the update: one "
       "chain writing all three, its six scalars constants: one call in all)",
       [](const std::vector<Tensor>& t) {
         Tensor m = 0.9 * t[1] + 0.1 * t[3];
         Tensor v = 0.999 * t[2] + 0.001 * (t[3] * t[3]);
         Tensor p = t[0] - 0.01 * (m / (sqrt(v) + 1e-8));
         return std::vector<Tensor>{p, m, v};
       },
       {{70, 130}, {70, 130}, {70, 130}, {70, 130}},
       1,
       12,
       6,
       3},
      {"a long last dimension, split across tiles",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{tanh(t[0] * 0.5 + t[1]) * t[1] - 1.0};
       },
       {{3, 10000}, {3, 10000}},
       1,
       5,
       2},
      {"a row and a middle broadcast, a transposed read",
       [](const std::vector<Tensor>& t) {
         Tensor x = t[0] + reshape(t[1], {4, 1, 60});
         return std::vector<Tensor>{relu(x * t[2] - 0.25)};
       },
       {{4, 50, 60}, {4, 60}, {60}},
       1,
       4,
       1},
      {"a transposed operand",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{exp(transpose(t[0]) * 0.5) + t[1]};
       },
       {{90, 80}, {80, 90}},
       1,
       4,
       1},
      {"a comparison only a select reads, and a negation",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{where(t[0] > t[1], t[0] * 2.0, -t[1]) / 3.0};
       },
       {{33, 257}, {33, 257}},
       1,
       5,
       2},
      {"bfloat16, float64 and int32 casts",
       [](const std::vector<Tensor>& t) {
         Tensor h = astype(astype(t[0], DType::bf16) * 3.0, DType::f32);
         Tensor d = astype(t[1], DType::f64) / 7.0 + 1.0;
         Tensor i = astype(t[0] * 1000.0, DType::i32);
         Tensor w = i * 2147483 + 1000000007;  // wraps
         return std::vector<Tensor>{h + 1.0, d * d, w};
       },
       {{40, 40}, {40, 40}},
       3,
       12,
       7},
      {"a rank-0 chain after a reduction",
       [](const std::vector<Tensor>& t) {
         return std::vector<Tensor>{sqrt(sum(t[0]) * 2.0 + 1.0)};
       },
       {{5, 7}},
       1,
       3,
       2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<Tensor> a, b;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      const int64_t n = shape_size(c.shapes[i]);
      std::vector<float> va = ramp(n, 0.37f + 0.1f * static_cast<float>(i), -2.0f);
      std::vector<float> vb = ramp(n, -0.61f, 1.5f + static_cast<float>(i));
      // NaN, infinities and zeros (0 / 0, sqrt of negatives, x / 0) in the second set.
      vb[0] = std::numeric_limits<float>::quiet_NaN();
      vb[1 % vb.size()] = std::numeric_limits<float>::infinity();
      vb[2 % vb.size()] = -std::numeric_limits<float>::infinity();
      vb[3 % vb.size()] = 0.0f;
      a.push_back(vec(va, c.shapes[i]));
      b.push_back(vec(vb, c.shapes[i]));
    }
    // Fused: recorded with the cpu's chains.
    KernelRecord r = record_kernels(c.fn, a);
    ASSERT_NE(r.program, nullptr) << r.why_not;
    EXPECT_EQ(count_kind(*r.program, K::chain), c.chains);
    int chained = 0, outputs = 0, constants = 0;
    for (const detail::KernelCall& call : r.program->calls) {
      if (call.kind != K::chain) continue;
      for (const backend::ChainOp& o : call.chain->ops) {
        const bool constant = o.kind == backend::ChainOp::Kind::constant;
        (constant ? constants : chained) += 1;
      }
      outputs += static_cast<int>(call.chain->output_count());
      EXPECT_EQ(call.more.size() + 1, call.chain->output_count());
    }
    EXPECT_EQ(chained, c.unfused_calls);
    EXPECT_EQ(constants, c.constants);
    EXPECT_EQ(outputs, c.outputs < 0 ? c.chains : c.outputs);
    for (const auto& ops : {a, b}) {
      const std::vector<Tensor> want = c.fn(ops);
      const std::vector<std::vector<char>> got = run(*r.program, ops);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i].size(), want[i].nbytes());
        EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), got[i].size())) << "result " << i;
      }
    }
    // Unfused: the same calls, one per kernel.
    const Unfused unfused;
    KernelRecord plain = record_kernels(c.fn, a);
    ASSERT_NE(plain.program, nullptr) << plain.why_not;
    EXPECT_EQ(count_kind(*plain.program, K::chain), 0);
    // Each literal was a one-element fill, dropped once its chain holds it.
    EXPECT_EQ(count_kind(*plain.program, K::fill) - count_kind(*r.program, K::fill), c.constants);
    EXPECT_EQ(
        plain.program->calls.size(),
        r.program->calls.size() + static_cast<size_t>(c.unfused_calls - c.chains + c.constants));
  }
}

// Intermediates something else needs stay in memory (a result, or read by two calls); float16
// division, whose reciprocal path depends on the whole shape's broadcast, stays apart on cpu.
TEST(KernelTape, ChainsKeepWhatOthersRead) {
  using K = detail::KernelCall::Kind;
  const std::vector<Tensor> ops = {vec(ramp(12, 0.5f, -2.0f), {3, 4}),
                                   vec(ramp(12, -0.25f, 1.0f), {3, 4})};
  // z feeds two calls of one chain: z + 1 and z * 2 read it in registers, and z is never written.
  Fn shared = [](const std::vector<Tensor>& t) {
    Tensor z = exp(t[0] + t[1]);
    return std::vector<Tensor>{(z + 1.0) * (z * 2.0)};
  };
  // z is needed past the chain: read by a reduction, or a result. The chain writes it too.
  Fn reduced = [](const std::vector<Tensor>& t) {
    Tensor z = exp(t[0] + t[1]);
    return std::vector<Tensor>{(z + 1.0) * (z * 2.0), sum(z, 0)};
  };
  Fn returned = [](const std::vector<Tensor>& t) {
    Tensor z = exp(t[0] + t[1]);
    return std::vector<Tensor>{(z + 1.0) * (z * 2.0), z};
  };
  const std::vector<std::pair<Fn, size_t>> fns = {{shared, 1}, {reduced, 2}, {returned, 2}};
  for (const auto& [fn, outputs] : fns) {
    KernelRecord r = record_kernels(fn, ops);
    ASSERT_NE(r.program, nullptr) << r.why_not;
    EXPECT_EQ(count_kind(*r.program, K::chain), 1);
    EXPECT_EQ(count_kind(*r.program, K::fill), 0);
    for (const detail::KernelCall& call : r.program->calls) {
      if (call.kind != K::chain) continue;
      EXPECT_EQ(call.chain->ops.size(), 7u);  // 5 kernels and the scalars 1 and 2
      EXPECT_EQ(call.chain->output_count(), outputs);
    }
    expect_reproduces(fn, ops, {vec(ramp(12, 0.125f, 1.0f), {3, 4}), ops[0]});
  }
  Fn halves = [](const std::vector<Tensor>& t) {
    Tensor h = astype(t[0], DType::f16);
    return std::vector<Tensor>{(h / astype(t[1], DType::f16)) + 1.0};
  };
  KernelRecord f16 = record_kernels(halves, ops);
  ASSERT_NE(f16.program, nullptr) << f16.why_not;
  for (const detail::KernelCall& call : f16.program->calls) {
    if (call.kind != K::chain) continue;
    for (const backend::ChainOp& o : call.chain->ops) {
      EXPECT_FALSE(o.kind == backend::ChainOp::Kind::binary &&
                   o.op == static_cast<int>(backend::BinaryOp::div) && o.in == DType::f16);
    }
  }
  expect_reproduces(halves, ops, {ops[1], ops[0]});
}

// A one-row product added to itself reads the product as a "row" too: it is no bias (the fused
// call would read the product's temporary, which it no longer writes).
TEST(KernelTape, KeepsAOneRowProductAddedToItself) {
  Fn twice = [](const std::vector<Tensor>& t) {
    Tensor z = matmul(t[0], t[1]);
    return std::vector<Tensor>{z + z};
  };
  Fn self_relu = [](const std::vector<Tensor>& t) {
    Tensor z = matmul(t[0], t[1]);
    return std::vector<Tensor>{relu(z + z)};
  };
  const std::vector<Tensor> ops = {vec(ramp(5, 0.3f, -2.0f), {1, 5}),
                                   vec(ramp(35, -0.2f, 1.0f), {5, 7})};
  const Unfused unfused;
  for (const Fn& fn : {twice, self_relu}) {
    KernelRecord r = record_kernels(fn, ops);
    ASSERT_NE(r.program, nullptr) << r.why_not;
    KernelProgram p = *r.program;
    (void)detail::fuse_elementwise_pairs(p);
    EXPECT_EQ(detail::fuse_matmul_epilogues(p), 0);
    EXPECT_EQ(count_kind(p, detail::KernelCall::Kind::matmul_bias), 0);
  }
}

// Whether fn's only result may be written into operand `o`'s buffer (jit's in-place donation).
bool result_may_take(const Fn& fn, const std::vector<Tensor>& operands, int o) {
  const Unfused unfused;
  KernelRecord r = record_kernels(fn, operands);
  if (r.program == nullptr) throw std::runtime_error(r.why_not);
  const KernelProgram& p = *r.program;
  return p.may_write_over(o, static_cast<size_t>(p.results.at(0).slot - p.operands));
}

TEST(KernelTape, WhichOperandsAResultMayOverwrite) {
  const Tensor w = vec(ramp(64, 0.5f, -2), {8, 8}), g = vec(ramp(64, 0.25f, 1), {8, 8});
  // The update reads w and g element for element where it writes (g through a temporary).
  Fn update = [](const std::vector<Tensor>& t) { return std::vector<Tensor>{t[0] - 0.5 * t[1]}; };
  EXPECT_TRUE(result_may_take(update, {w, g}, 0));
  EXPECT_TRUE(result_may_take(update, {w, g}, 1));
  // The transposed copy goes to a temporary first (Tensor transpose copies): w is not read once
  // the result is written.
  Fn shifted = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{transpose(t[0]) + 1.0};
  };
  EXPECT_TRUE(result_may_take(shifted, {w}, 0));
  // The result is written by copies, the second of which reads w after the first wrote.
  Fn joined = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{concatenate({t[0] * 2.0, t[0]})};
  };
  EXPECT_FALSE(result_may_take(joined, {w}, 0));
  // A comparison writes bools over float32s: one element size to another.
  Fn compared = [](const std::vector<Tensor>& t) { return std::vector<Tensor>{t[0] > t[1]}; };
  EXPECT_FALSE(result_may_take(compared, {w, g}, 0));
  // A row-broadcast operand is read at other elements than written.
  const Tensor row = vec(ramp(8, 1, 0), {8});
  Fn broadcast = [](const std::vector<Tensor>& t) { return std::vector<Tensor>{t[0] * t[1]}; };
  EXPECT_TRUE(result_may_take(broadcast, {w, row}, 0));
  EXPECT_FALSE(result_may_take(broadcast, {w, row}, 1));
  // select: its float32 values are read where written; its bool condition is one byte per
  // element under a four-byte result.
  const Tensor mask = w > g;
  Fn selected = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{where(t[2], t[0], t[1])};
  };
  EXPECT_TRUE(result_may_take(selected, {w, g, mask}, 0));
  EXPECT_TRUE(result_may_take(selected, {w, g, mask}, 1));
  EXPECT_FALSE(result_may_take(selected, {w, g, mask}, 2));
  // A row of w (a view) is read at another offset than the result is written at; row 0 at the
  // same one.
  Fn fifth_row = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{meshrt::row(t[0], 4) + 1.0};
  };
  EXPECT_FALSE(result_may_take(fifth_row, {w}, 0));
  Fn first_row = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{meshrt::row(t[0], 0) + 1.0};
  };
  EXPECT_TRUE(result_may_take(first_row, {w}, 0));
  // Padding fills the result first, then copies w into it: w is read after the first write.
  Fn padded = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{pad(t[0], {{1, 0}, {0, 0}}, 0.0)};
  };
  EXPECT_FALSE(result_may_take(padded, {w}, 0));
}

// A chain may write over an operand it reads only element for element where it writes.
TEST(KernelTape, WhichOperandsAChainMayOverwrite) {
  auto may_take = [](const Fn& fn, const std::vector<Tensor>& operands, int o) {
    KernelRecord r = record_kernels(fn, operands);
    if (r.program == nullptr) throw std::runtime_error(r.why_not);
    const KernelProgram& p = *r.program;
    EXPECT_EQ(count_kind(p, detail::KernelCall::Kind::chain), 1);
    return p.may_write_over(o, static_cast<size_t>(p.results.at(0).slot - p.operands));
  };
  const Tensor w = vec(ramp(64, 0.5f, -2), {8, 8}), g = vec(ramp(64, 0.25f, 1), {8, 8});
  Fn update = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{t[0] - 0.5 * (t[1] * t[1])};
  };
  EXPECT_TRUE(may_take(update, {w, g}, 0));
  EXPECT_TRUE(may_take(update, {w, g}, 1));
  // Read transposed inside the chain: other elements than the tile writes.
  Fn shifted = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{transpose(t[0]) * 2.0 + 1.0};
  };
  EXPECT_FALSE(may_take(shifted, {w}, 0));
  // A bool operand under a float32 result.
  const Tensor mask = w > g;
  Fn selected = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{where(t[1], t[0], t[0] * 0.5) + 1.0};
  };
  EXPECT_TRUE(may_take(selected, {w, mask}, 0));
  EXPECT_FALSE(may_take(selected, {w, mask}, 1));
  // A chain with two outputs (m, and the update reading it): each may take the operand it reads
  // where it writes, and not one it reads elsewhere.
  Fn two = [](const std::vector<Tensor>& t) {
    Tensor m = t[1] * 0.9 + t[2];
    return std::vector<Tensor>{t[0] - 0.5 * m, m};
  };
  const Tensor m0 = vec(ramp(64, -0.125f, 3), {8, 8});
  KernelRecord r = record_kernels(two, {w, g, m0});
  ASSERT_NE(r.program, nullptr) << r.why_not;
  const KernelProgram& p = *r.program;
  ASSERT_EQ(count_kind(p, detail::KernelCall::Kind::chain), 1);
  auto temp_of = [&](size_t result) {
    return static_cast<size_t>(p.results.at(result).slot - p.operands);
  };
  for (size_t result : {0u, 1u}) {
    for (int o : {0, 1, 2}) EXPECT_TRUE(p.may_write_over(o, temp_of(result))) << result << o;
  }
  Fn two_shifted = [](const std::vector<Tensor>& t) {
    Tensor m = transpose(t[1]) * 0.9 + t[2];
    return std::vector<Tensor>{t[0] - 0.5 * m, m};
  };
  KernelRecord rs = record_kernels(two_shifted, {w, g, m0});
  ASSERT_NE(rs.program, nullptr) << rs.why_not;
  const KernelProgram& ps = *rs.program;
  for (size_t result : {0u, 1u}) {
    EXPECT_FALSE(
        ps.may_write_over(1, static_cast<size_t>(ps.results.at(result).slot - ps.operands)))
        << result;
  }
}

// A call joins its first reader only where nothing between rewrites what it reads or writes: the
// fused call computes at the reader's place. Hand-made programs (a recording never rewrites a
// temporary, but jit's merged programs and later passes may meet any order).
TEST(KernelTape, ChainsMoveOnlyPastCallsThatLeaveThemAlone) {
  using K = detail::KernelCall::Kind;
  const Tensor x = vec({1, 2, 3, 4, 5, 6}, {6});
  auto fill = [](int32_t slot, int64_t n, double v) {
    detail::KernelCall c;
    c.kind = K::fill;
    c.arg[0] = n;
    c.value = v;
    c.dst = {slot, 0};
    return c;
  };
  // One elementwise call over (6): sources and their strides, into `dst`.
  auto call = [](KernelProgram& p, K kind, int op, std::vector<std::pair<int32_t, int64_t>> srcs,
                 int32_t dst) {
    detail::KernelCall c;
    c.kind = kind;
    c.op = op;
    c.shape = {6};
    c.nsrc = static_cast<int>(srcs.size());
    c.strided = static_cast<int>(p.strides.size());
    for (size_t j = 0; j < srcs.size(); ++j) {
      c.src[j] = {srcs[j].first, 0};
      p.strides.push_back({srcs[j].second});
    }
    c.dst = {dst, 0};
    return c;
  };
  const int mul = static_cast<int>(backend::BinaryOp::mul);
  const int add = static_cast<int>(backend::BinaryOp::add);
  const int neg = static_cast<int>(backend::UnaryOp::neg);
  auto program = [&](int rewrite) {  // slots: 0 x; 1 a scalar; 2, 3 (6)-element temporaries
    KernelProgram p;
    p.operands = 1;
    p.temp_bytes = {4, 24, 24};
    if (rewrite >= 3) {  // a temporary written twice: the chain must not write it twice at once
      const std::vector<std::pair<int32_t, int64_t>> x1{{0, 1}};
      p.calls.push_back(call(p, K::unary, neg, x1, 2));  // T = -x
      if (rewrite == 3) {                                // T = T + x, in place; result T
        p.calls.push_back(call(p, K::binary, add, {{2, 1}, {0, 1}}, 2));
        p.results = {{2, 0}};
      } else {  // U = T * x; T = U + x; results T and U
        p.calls.push_back(call(p, K::binary, mul, {{2, 1}, {0, 1}}, 3));
        p.calls.push_back(call(p, K::binary, add, {{3, 1}, {0, 1}}, 2));
        p.results = {{2, 0}, {3, 0}};
      }
      p.result_shapes.assign(p.results.size(), Shape{6});
      p.result_dtypes.assign(p.results.size(), DType::f32);
      return p;
    }
    if (rewrite == 0) {  // y = x * 2, the scalar rewritten to 5, then y + 5
      p.calls.push_back(fill(1, 1, 2.0));
      p.calls.push_back(call(p, K::binary, mul, {{0, 1}, {1, 0}}, 2));
      p.calls.push_back(fill(1, 1, 5.0));
      p.calls.push_back(call(p, K::binary, add, {{2, 1}, {1, 0}}, 3));
    } else if (rewrite == 1) {  // y = -x, y rewritten to 7s, then y + x
      p.calls.push_back(call(p, K::unary, neg, {{0, 1}}, 2));
      p.calls.push_back(fill(2, 6, 7.0));
      p.calls.push_back(call(p, K::binary, add, {{2, 1}, {0, 1}}, 3));
    } else {  // y = -x, a fill elsewhere, then y + x: free to fuse
      p.calls.push_back(call(p, K::unary, neg, {{0, 1}}, 2));
      p.calls.push_back(fill(1, 1, 7.0));
      p.calls.push_back(call(p, K::binary, add, {{2, 1}, {0, 1}}, 3));
    }
    p.results = {{3, 0}};
    p.result_shapes = {Shape{6}};
    p.result_dtypes = {DType::f32};
    return p;
  };
  const std::vector<std::vector<float>> want = {{7, 9, 11, 13, 15, 17},
                                                {8, 9, 10, 11, 12, 13},
                                                {0, 0, 0, 0, 0, 0},
                                                {0, 0, 0, 0, 0, 0},
                                                {0, -2, -6, -12, -20, -30}};
  const backend::Backend& be = detail::backend_of(x.device());
  for (int rewrite : {0, 1, 2, 3, 4}) {
    SCOPED_TRACE(rewrite);
    KernelProgram p = program(rewrite);
    const KernelProgram unfused = p;
    const int fused = detail::fuse_elementwise_chains(p, be);
    // (4: -x and T * x fuse, writing T and U; the add that rewrites T stays apart.)
    EXPECT_EQ(fused, rewrite == 2 || rewrite == 4 ? 1 : 0);
    const std::vector<std::vector<char>> got = run(p, {x}), plain = run(unfused, {x});
    std::vector<float> y(6);
    std::memcpy(y.data(), got.at(0).data(), 24);
    EXPECT_EQ(y, want[static_cast<size_t>(rewrite)]);
    EXPECT_EQ(got, plain);
  }
}

TEST(KernelTape, RefusesHostData) {
  Fn fn = [](const std::vector<Tensor>& t) {
    std::vector<float> host = t[0].to_vector<float>();  // the host reads the operand
    host[0] += 1.0f;
    return std::vector<Tensor>{tensor(host, t[0].shape(), t[0].device())};
  };
  KernelRecord r = record_kernels(fn, {vec(ramp(4, 1.0f, 0.0f), {4})});
  EXPECT_EQ(r.program, nullptr);
  EXPECT_NE(r.why_not.find("host"), std::string::npos) << r.why_not;
}

TEST(KernelTape, RefusesWritesOutsideTheKernels) {
  Fn fn = [](const std::vector<Tensor>& t) {
    Tensor y = empty(t[0].shape(), t[0].dtype(), t[0].device());
    std::memcpy(y.data(), t[0].data(), t[0].nbytes());  // no backend kernel: the tape cannot see it
    return std::vector<Tensor>{y * 2.0};
  };
  KernelRecord r = record_kernels(fn, {vec(ramp(4, 1.0f, 0.5f), {4})});
  EXPECT_EQ(r.program, nullptr);
  EXPECT_NE(r.why_not.find("do not reproduce"), std::string::npos) << r.why_not;
}

TEST(KernelTape, RefusesResultsThatViewAnOperand) {
  Fn fn = [](const std::vector<Tensor>& t) { return std::vector<Tensor>{reshape(t[0], {2, 2})}; };
  KernelRecord r = record_kernels(fn, {vec(ramp(4, 1.0f, 0.5f), {4})});
  EXPECT_EQ(r.program, nullptr);
  EXPECT_NE(r.why_not.find("views an operand"), std::string::npos) << r.why_not;
}

TEST(KernelTape, RefusesWorkOnAnotherDevice) {
  if (devices().size() < 2) GTEST_SKIP() << "needs two devices";
  Fn fn = [](const std::vector<Tensor>& t) {
    Tensor other = zeros(t[0].shape(), t[0].dtype(), devices()[1]);
    return std::vector<Tensor>{t[0] + 1.0, other};
  };
  KernelRecord r = record_kernels(fn, {vec(ramp(4, 1.0f, 0.5f), {4})});
  EXPECT_EQ(r.program, nullptr);
  EXPECT_NE(r.why_not.find("another device"), std::string::npos) << r.why_not;
}

TEST(KernelTape, OnlyTheRecordingThreadSeesTheTape) {
  // Outside a recording, backend_of is the real backend.
  backend::Backend& real = detail::backend_of(devices()[0]);
  EXPECT_EQ(detail::kernel_tape_for(real), nullptr);
}

}  // namespace
