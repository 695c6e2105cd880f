// Device-local ops against a float64 host reference, written once and instantiated per platform.
// Tolerances (relative, with an absolute floor of the same size): float32 2e-6 elementwise and
// 1e-5 for reductions/matmul; float64 1e-13 and 1e-12; integers and bools exact. Shapes are
// random (ranks 0-3, size-0 and size-1 dimensions), operands broadcast, axes may be negative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "backends/merge_dims.h"
#include "core/config.h"
#include "runtime/detail/access.h"
#include "tests/host_ref.h"
#include "tests/test_util.h"

namespace meshrt {
namespace {

using test::HostArr;

class Ops : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto ps = platforms();
    if (std::find(ps.begin(), ps.end(), GetParam()) == ps.end()) {
      GTEST_SKIP() << "platform " << GetParam() << " is not usable on this machine";
    }
    dev_ = devices(GetParam())[0];
  }
  Device dev_;
  std::mt19937 rng_{1234};
};

// ---- helpers

std::vector<double> values(const Tensor& t) { return test::host_values(t); }

Tensor make(const HostArr& h, DType dt, Device d) {
  switch (dt) {
    case DType::f32:
      return tensor(std::vector<float>(h.v.begin(), h.v.end()), h.shape, d);
    case DType::f64:
      return tensor(h.v, h.shape, d);
    case DType::i32:
      return tensor(std::vector<int32_t>(h.v.begin(), h.v.end()), h.shape, d);
    case DType::i64:
      return tensor(std::vector<int64_t>(h.v.begin(), h.v.end()), h.shape, d);
    case DType::bool_: {
      std::vector<bool> b;
      for (double x : h.v) b.push_back(x != 0);
      return tensor(b, h.shape, d);
    }
  }
  throw std::logic_error("dtype");
}

// Values representable exactly in every dtype (so the reference sees what the tensor holds).
HostArr random_arr(std::mt19937& rng, const Shape& shape, DType dt, double lo = -3, double hi = 3) {
  HostArr h = test::make_arr(shape);
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& v : h.v) {
    if (dt == DType::bool_)
      v = rng() % 2;
    else if (dt == DType::i32 || dt == DType::i64)
      v = std::round(u(rng) * 7);
    else
      v = static_cast<double>(static_cast<float>(u(rng)));
  }
  return h;
}

Shape random_shape(std::mt19937& rng, int max_rank = 3) {
  Shape s(rng() % (max_rank + 1));
  for (int64_t& d : s) d = rng() % 5;  // includes 0 and 1
  return s;
}

// A shape that broadcasts to `out`: a suffix of it with some dims set to 1.
Shape broadcastable_to(std::mt19937& rng, const Shape& out) {
  Shape s(out.end() - static_cast<std::ptrdiff_t>(rng() % (out.size() + 1)), out.end());
  for (int64_t& d : s) {
    if (rng() % 3 == 0) d = 1;
  }
  return s;
}

// Reads `h` at `idx` of the broadcast output shape.
double bcast_at(const HostArr& h, const std::vector<int64_t>& idx) {
  std::vector<int64_t> i(h.shape.size());
  const size_t off = idx.size() - h.shape.size();
  for (size_t d = 0; d < h.shape.size(); ++d) i[d] = h.shape[d] == 1 ? 0 : idx[off + d];
  return h.v[static_cast<size_t>(h.at(i))];
}

Shape broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

double tol(DType dt, bool accumulates) {
  switch (dt) {
    case DType::f32:
      return accumulates ? 1e-5 : 2e-6;
    case DType::f64:
      return accumulates ? 1e-12 : 1e-13;
    default:
      return 0;
  }
}

void expect_close(const Tensor& got, const HostArr& want, DType dt, bool accumulates,
                  const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape) << what;
  ASSERT_EQ(got.dtype(), dt) << what << ": dtype " << dtype_name(got.dtype()) << " vs "
                             << dtype_name(dt);
  std::vector<double> g = values(got);
  const double t = tol(dt, accumulates);
  for (size_t i = 0; i < g.size(); ++i) {
    const double w = want.v[i];
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g[i])) << what << " [" << i << "]";
    } else if (t == 0 || std::isinf(w)) {
      EXPECT_EQ(g[i], w) << what << " [" << i << "]";
    } else {
      EXPECT_NEAR(g[i], w, t * std::max(1.0, std::fabs(w))) << what << " [" << i << "]";
    }
  }
}

// The reference of an elementwise binary op over broadcast operands.
HostArr ref_binary(const HostArr& a, const HostArr& b,
                   const std::function<double(double, double)>& f) {
  HostArr out = test::make_arr(broadcast(a.shape, b.shape));
  test::for_each_index(out.shape, [&](const std::vector<int64_t>& idx) {
    out.v[static_cast<size_t>(out.at(idx))] = f(bcast_at(a, idx), bcast_at(b, idx));
  });
  return out;
}

// Rounds a reference computed in double to what a float32/int32 result holds.
double as_dtype(double v, DType dt) {
  switch (dt) {
    case DType::f32:
      return static_cast<float>(v);
    case DType::i32:
      return static_cast<int32_t>(v);
    case DType::bool_:
      return v != 0;
    default:
      return v;
  }
}

const DType kAll[] = {DType::f32, DType::f64, DType::i32, DType::i64, DType::bool_};

// ---- creation

TEST_P(Ops, Creation) {
  EXPECT_EQ(values(zeros({2, 3}, DType::f64, dev_)), std::vector<double>(6, 0.0));
  EXPECT_EQ(values(ones({4}, DType::i32, dev_)), std::vector<double>(4, 1.0));
  EXPECT_EQ(values(full({2, 2}, 2.5, DType::f32, dev_)), std::vector<double>(4, 2.5));
  EXPECT_EQ(values(arange(5, DType::f32, dev_)), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(0, DType::i64, dev_).shape(), (Shape{0}));
  Tensor a = arange(6, DType::i32, dev_);
  EXPECT_EQ(astype(a, DType::f64).dtype(), DType::f64);
  EXPECT_EQ(values(astype(full({3}, -2.7, DType::f32, dev_), DType::i32)),
            (std::vector<double>{-2, -2, -2}));
  EXPECT_EQ(values(astype(a, DType::bool_)), (std::vector<double>{0, 1, 1, 1, 1, 1}));
  Tensor c = copy(a);
  EXPECT_NE(c.data(), a.data());
  EXPECT_EQ(values(c), values(a));
  EXPECT_MESHRT_ERROR(arange(-1, DType::f32, dev_), "[ops] arange", "negative");
  EXPECT_MESHRT_ERROR(zeros({-2}, DType::f32, dev_), "negative dimension");
}

// ---- elementwise

struct BinCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
  bool compare;
};

TEST_P(Ops, BinaryBroadcastingAndPromotion) {
  const std::vector<BinCase> cases = {
      {"add", [](auto& a, auto& b) { return a + b; }, [](double x, double y) { return x + y; },
       false},
      {"subtract", [](auto& a, auto& b) { return a - b; }, [](double x, double y) { return x - y; },
       false},
      {"multiply", [](auto& a, auto& b) { return a * b; }, [](double x, double y) { return x * y; },
       false},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); },
       [](double x, double y) { return std::max(x, y); }, false},
      {"minimum", [](auto& a, auto& b) { return minimum(a, b); },
       [](double x, double y) { return std::min(x, y); }, false},
      {"equal", [](auto& a, auto& b) { return a == b; },
       [](double x, double y) { return double(x == y); }, true},
      {"not_equal", [](auto& a, auto& b) { return a != b; },
       [](double x, double y) { return double(x != y); }, true},
      {"less", [](auto& a, auto& b) { return a < b; },
       [](double x, double y) { return double(x < y); }, true},
      {"less_equal", [](auto& a, auto& b) { return a <= b; },
       [](double x, double y) { return double(x <= y); }, true},
      {"greater", [](auto& a, auto& b) { return a > b; },
       [](double x, double y) { return double(x > y); }, true},
      {"greater_equal", [](auto& a, auto& b) { return a >= b; },
       [](double x, double y) { return double(x >= y); }, true},
  };
  int checked = 0;
  for (const BinCase& c : cases) {
    for (DType da : kAll) {
      for (DType db : kAll) {
        if (std::string(c.name) == "subtract" && da == DType::bool_ && db == DType::bool_) continue;
        for (int rep = 0; rep < 3; ++rep) {
          Shape out = random_shape(rng_);
          HostArr ha = random_arr(rng_, broadcastable_to(rng_, out), da);
          HostArr hb = random_arr(rng_, broadcastable_to(rng_, out), db);
          const DType t = promote_types(da, db);
          const DType want_t = c.compare ? DType::bool_ : t;
          HostArr want = ref_binary(ha, hb, [&](double x, double y) {
            if (t == DType::bool_ && !c.compare) {  // bool arithmetic is logical
              return std::string(c.name) == "add"        ? double(x || y)
                     : std::string(c.name) == "multiply" ? double(x && y)
                                                         : c.ref(x, y);
            }
            return as_dtype(c.ref(as_dtype(x, t), as_dtype(y, t)), want_t);
          });
          expect_close(c.op(make(ha, da, dev_), make(hb, db, dev_)), want, want_t, false,
                       std::string(c.name) + " " + std::string(dtype_name(da)) +
                           shape_str(ha.shape) + " " + std::string(dtype_name(db)) +
                           shape_str(hb.shape));
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 700);
  // JAX's promotion lattice (x64): ints with float32 give float32; true division of ints gives
  // floats.
  EXPECT_EQ(promote_types(DType::i64, DType::f32), DType::f32);
  EXPECT_EQ(promote_types(DType::i32, DType::i64), DType::i64);
  EXPECT_EQ(promote_types(DType::bool_, DType::i32), DType::i32);
  EXPECT_EQ((ones({2}, DType::i32, dev_) / ones({2}, DType::i32, dev_)).dtype(), DType::f32);
  EXPECT_EQ((ones({2}, DType::i64, dev_) / ones({2}, DType::i64, dev_)).dtype(), DType::f64);
}

TEST_P(Ops, DivisionAndScalars) {
  HostArr a = random_arr(rng_, {3, 4}, DType::f32), b = random_arr(rng_, {4}, DType::f32, 0.5, 3);
  expect_close(
      make(a, DType::f32, dev_) / make(b, DType::f32, dev_),
      ref_binary(a, b,
                 [](double x, double y) {
                   return static_cast<float>(static_cast<float>(x) / static_cast<float>(y));
                 }),
      DType::f32, false, "divide");
  // Weak scalars (JAX, x64): float tensors keep their dtype; int tensors with a double -> float64.
  Tensor xi = arange(4, DType::i32, dev_), xf = arange(4, DType::f32, dev_),
         xb = astype(arange(4, DType::i32, dev_), DType::bool_);
  EXPECT_EQ((xf * 2.0).dtype(), DType::f32);
  EXPECT_EQ((xf * 2).dtype(), DType::f32);
  EXPECT_EQ((xi * 2.0).dtype(), DType::f64);
  EXPECT_EQ((xi + 1).dtype(), DType::i32);
  EXPECT_EQ((xb + 1).dtype(), DType::i64);
  EXPECT_EQ(values(2.0 - xf), (std::vector<double>{2, 1, 0, -1}));
  EXPECT_EQ(values(1.0 / (xf + 1.0)),
            (std::vector<double>{1, 0.5, static_cast<float>(1.0 / 3), 0.25}));
  EXPECT_EQ(values(maximum(xi, 2)), (std::vector<double>{2, 2, 2, 3}));
  EXPECT_EQ(values(minimum(xf, 1.5)), (std::vector<double>{0, 1, 1.5, 1.5}));
  // NaN propagates through maximum / minimum, as in XLA.
  Tensor nan = full({1}, std::numeric_limits<double>::quiet_NaN(), DType::f64, dev_);
  EXPECT_TRUE(std::isnan(values(maximum(nan, ones({1}, DType::f64, dev_)))[0]));
  EXPECT_TRUE(std::isnan(values(minimum(ones({1}, DType::f64, dev_), nan))[0]));
  // Integer arithmetic wraps like XLA.
  Tensor big = full({1}, 2147483647, DType::i32, dev_);
  EXPECT_EQ(values(big + 1), (std::vector<double>{-2147483648.0}));
}

TEST_P(Ops, Unary) {
  struct U {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> ref;
    double lo;
  };
  const std::vector<U> cases = {
      {"neg", [](auto& x) { return -x; }, [](double v) { return -v; }, -3},
      {"exp", [](auto& x) { return exp(x); }, [](double v) { return std::exp(v); }, -3},
      {"log", [](auto& x) { return log(x); }, [](double v) { return std::log(v); }, 0.01},
      {"sin", [](auto& x) { return sin(x); }, [](double v) { return std::sin(v); }, -3},
      {"cos", [](auto& x) { return cos(x); }, [](double v) { return std::cos(v); }, -3},
      {"tanh", [](auto& x) { return tanh(x); }, [](double v) { return std::tanh(v); }, -3},
      {"sqrt", [](auto& x) { return sqrt(x); }, [](double v) { return std::sqrt(v); }, 0},
      {"relu", [](auto& x) { return relu(x); }, [](double v) { return v > 0 ? v : 0; }, -3},
  };
  for (const U& c : cases) {
    for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64}) {
      Shape s = random_shape(rng_);
      HostArr h = random_arr(rng_, s, dt, c.lo, 3);
      if (dt == DType::i32 || dt == DType::i64) {
        for (double& v : h.v)
          v = std::max(v, std::string(c.name) == "log" ? 1.0 : c.lo < 0 ? v : 0.0);
      }
      const bool keeps = std::string(c.name) == "neg" || std::string(c.name) == "relu";
      const DType out = keeps ? dt : float_dtype_for(dt);
      HostArr want = h;
      for (double& v : want.v) v = as_dtype(c.ref(as_dtype(v, out)), out);
      Tensor got = c.op(make(h, dt, dev_));
      // Transcendentals: float32 libm results may differ from the double reference by an ulp.
      expect_close(got, want, out, std::string(c.name) != "neg" && std::string(c.name) != "relu",
                   std::string(c.name) + " " + std::string(dtype_name(dt)) + shape_str(s));
    }
  }
  EXPECT_MESHRT_ERROR(neg(astype(ones({1}, DType::i32, dev_), DType::bool_)), "[ops] neg", "bool");
}

TEST_P(Ops, Where) {
  for (int rep = 0; rep < 20; ++rep) {
    Shape out = random_shape(rng_);
    HostArr c = random_arr(rng_, broadcastable_to(rng_, out), DType::bool_);
    HostArr a = random_arr(rng_, broadcastable_to(rng_, out), DType::i32);
    HostArr b = random_arr(rng_, broadcastable_to(rng_, out), DType::f32);
    HostArr want = test::make_arr(broadcast(broadcast(c.shape, a.shape), b.shape));
    test::for_each_index(want.shape, [&](const std::vector<int64_t>& idx) {
      want.v[static_cast<size_t>(want.at(idx))] =
          bcast_at(c, idx) != 0 ? bcast_at(a, idx) : bcast_at(b, idx);
    });
    expect_close(
        where(make(c, DType::bool_, dev_), make(a, DType::i32, dev_), make(b, DType::f32, dev_)),
        want, DType::f32, false, "where");
  }
  // Every value dtype, on the layouts the kernels take without a per-element index (dense
  // operands, a broadcast scalar either side) and a row-broadcast one, with runs long enough to
  // vectorise and a random mask.
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64, DType::bool_}) {
    const Shape out{3, 37};
    for (const auto& [sa, sb] :
         std::vector<std::pair<Shape, Shape>>{{out, out}, {out, {}}, {{}, out}, {{37}, out}}) {
      HostArr c = random_arr(rng_, out, DType::bool_);
      HostArr a = random_arr(rng_, sa, dt, -50, 50);
      HostArr b = random_arr(rng_, sb, dt, -50, 50);
      HostArr want = test::make_arr(out);
      test::for_each_index(out, [&](const std::vector<int64_t>& idx) {
        want.v[static_cast<size_t>(want.at(idx))] =
            bcast_at(c, idx) != 0 ? bcast_at(a, idx) : bcast_at(b, idx);
      });
      expect_close(where(make(c, DType::bool_, dev_), make(a, dt, dev_), make(b, dt, dev_)), want,
                   dt, false, "where, " + std::string(dtype_name(dt)));
    }
  }
  EXPECT_MESHRT_ERROR(
      where(ones({2}, DType::i32, dev_), ones({2}, DType::f32, dev_), ones({2}, DType::f32, dev_)),
      "[ops] where", "condition is int32");
  // Bool bytes other than 0 or 1 (memory written from outside, as from a file) read as true:
  // tensor() stores them as 1, and where picks a for them, on the vectorised layouts and the
  // strided one (both branches broadcast scalars).
  {
    std::vector<uint8_t> bytes(64);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i % 3 == 0 ? 0 : i);
    const Tensor c = tensor(bytes.data(), 64, DType::bool_, {8, 8}, dev_);
    const std::vector<int32_t> stored = astype(c, DType::i32).to_vector<int32_t>();
    for (size_t i = 0; i < bytes.size(); ++i) EXPECT_EQ(stored[i], bytes[i] != 0 ? 1 : 0) << i;
    const Tensor a = full({8, 8}, 1.0, DType::f32, dev_), b = full({8, 8}, -1.0, DType::f32, dev_);
    const Tensor one = full({}, 1.0, DType::f32, dev_),
                 minus_one = full({}, -1.0, DType::f32, dev_);
    const Tensor row = full({8}, -1.0, DType::f32, dev_);
    for (const Tensor& got : {where(c, a, b), where(c, a, minus_one), where(c, one, b),
                              where(c, a, row), where(c, one, minus_one)}) {
      const std::vector<float> v = got.to_vector<float>();
      for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], bytes[i] != 0 ? 1.0f : -1.0f) << i;
    }
  }
}

TEST_P(Ops, BroadcastErrorsAndDeviceMixing) {
  EXPECT_MESHRT_ERROR(ones({2, 3}, DType::f32, dev_) + ones({4, 3}, DType::f32, dev_), "[ops] add",
                      "shapes (2, 3) and (4, 3) are not broadcastable");
  EXPECT_MESHRT_ERROR(ones({3}, DType::f32, dev_) * ones({2}, DType::f32, dev_), "[ops] multiply",
                      "(3,) and (2,)");
  auto all = devices(GetParam());
  if (all.size() > 1) {
    const std::string other = all[1].str();
    EXPECT_MESHRT_ERROR(ones({2}, DType::f32, all[0]) + ones({2}, DType::f32, all[1]), "[ops] add",
                        "operands live on", other.c_str());
  }
  EXPECT_MESHRT_ERROR(ones({2}, DType::f32, dev_) + Tensor(), "[ops] add", "empty");
  EXPECT_MESHRT_ERROR(ones({2}, DType::bool_, dev_) - ones({2}, DType::bool_, dev_),
                      "subtracting bool");
}

// ---- reductions

TEST_P(Ops, Reductions) {
  for (int rep = 0; rep < 40; ++rep) {
    Shape s = random_shape(rng_);
    for (DType dt : kAll) {
      HostArr h = random_arr(rng_, s, dt);
      Tensor x = make(h, dt, dev_);
      std::vector<std::optional<int>> axes{std::nullopt};
      for (int a = 0; a < static_cast<int>(s.size()); ++a)
        axes.push_back(rng_() % 2 ? a : a - static_cast<int>(s.size()));
      for (std::optional<int> ax : axes) {
        for (bool keep : {false, true}) {
          // Reference: fold over the axis in double.
          const int a = ax ? (*ax < 0 ? *ax + static_cast<int>(s.size()) : *ax) : -1;
          Shape out_shape;
          for (int d = 0; d < static_cast<int>(s.size()); ++d) {
            if (a < 0 || d == a) {
              if (keep) out_shape.push_back(1);
            } else {
              out_shape.push_back(s[static_cast<size_t>(d)]);
            }
          }
          // Where input element idx lands in the reduced output.
          auto out_index = [&](const std::vector<int64_t>& idx) {
            std::vector<int64_t> o;
            for (int d = 0; d < static_cast<int>(s.size()); ++d) {
              if (a < 0 || d == a) {
                if (keep) o.push_back(0);
              } else {
                o.push_back(idx[static_cast<size_t>(d)]);
              }
            }
            return o;
          };
          auto fold = [&](auto init, auto f) {
            HostArr r = test::make_arr(out_shape);
            std::vector<bool> started(r.v.size(), false);
            test::for_each_index(s, [&](const std::vector<int64_t>& idx) {
              size_t at = static_cast<size_t>(r.at(out_index(idx)));
              const double v = h.v[static_cast<size_t>(h.at(idx))];
              const int64_t pos = a < 0 ? h.at(idx) : idx[static_cast<size_t>(a)];
              if (!started[at]) {
                r.v[at] = init(v, pos);
                started[at] = true;
              } else {
                r.v[at] = f(r.v[at], v, pos);
              }
            });
            for (size_t i = 0; i < r.v.size(); ++i) {
              if (!started[i]) r.v[i] = 0;  // empty sums
            }
            return r;
          };
          const int64_t len = a < 0 ? shape_size(s) : s[static_cast<size_t>(a)];
          const std::string tag = std::string(dtype_name(dt)) + shape_str(s) + " axis " +
                                  (ax ? std::to_string(*ax) : std::string("None")) +
                                  (keep ? " keepdims" : "");
          const DType sum_t = is_floating(dt) ? dt : DType::i64;
          expect_close(sum(x, ax, keep),
                       fold([](double v, int64_t) { return v; },
                            [](double acc, double v, int64_t) { return acc + v; }),
                       sum_t, true, "sum " + tag);
          HostArr m = fold([](double v, int64_t) { return v; },
                           [](double acc, double v, int64_t) { return acc + v; });
          for (double& v : m.v) v = as_dtype(v / static_cast<double>(len), float_dtype_for(dt));
          if (len > 0) expect_close(mean(x, ax, keep), m, float_dtype_for(dt), true, "mean " + tag);
          if (len == 0) {
            EXPECT_MESHRT_ERROR(max(x, ax, keep), "[ops] max", "zero-size array");
            EXPECT_MESHRT_ERROR(argmax(x, ax, keep), "[ops] argmax", "zero-size array");
            continue;
          }
          expect_close(max(x, ax, keep),
                       fold([](double v, int64_t) { return v; },
                            [](double acc, double v, int64_t) { return std::max(acc, v); }),
                       dt, false, "max " + tag);
          expect_close(min(x, ax, keep),
                       fold([](double v, int64_t) { return v; },
                            [](double acc, double v, int64_t) { return std::min(acc, v); }),
                       dt, false, "min " + tag);
          // argmax: index of the first maximum along the axis (flat index when axis is None).
          HostArr best = fold([](double v, int64_t) { return v; },
                              [](double acc, double v, int64_t) { return std::max(acc, v); });
          HostArr want = test::make_arr(out_shape);  // the first position holding the maximum
          std::vector<bool> found(want.v.size(), false);
          test::for_each_index(s, [&](const std::vector<int64_t>& idx) {
            size_t at = static_cast<size_t>(want.at(out_index(idx)));
            if (!found[at] && h.v[static_cast<size_t>(h.at(idx))] == best.v[at]) {
              want.v[at] = static_cast<double>(a < 0 ? h.at(idx) : idx[static_cast<size_t>(a)]);
              found[at] = true;
            }
          });
          expect_close(argmax(x, ax, keep), want, DType::i64, false, "argmax " + tag);
        }
      }
    }
  }
  EXPECT_MESHRT_ERROR(sum(ones({2, 3}, DType::f32, dev_), 2), "[ops] sum",
                      "axis 2 is out of bounds", "(2, 3)");
  EXPECT_MESHRT_ERROR(sum(ones({2, 3}, DType::f32, dev_), -3), "axis -3 is out of bounds");
  // NaN wins in max and argmax (first NaN), as in XLA.
  Tensor v = tensor(std::vector<double>{1, std::nan(""), 5, std::nan("")}, {4}, dev_);
  EXPECT_TRUE(std::isnan(values(max(v))[0]));
  EXPECT_EQ(values(argmax(v)), std::vector<double>{1});
}

TEST_P(Ops, SoftmaxAndLogSoftmax) {
  for (int rep = 0; rep < 20; ++rep) {
    Shape s{static_cast<int64_t>(1 + rng_() % 4), static_cast<int64_t>(1 + rng_() % 6)};
    for (DType dt : {DType::f32, DType::f64, DType::i32}) {
      HostArr h = random_arr(rng_, s, dt, -5, 5);
      for (int axis : {-1, 0, 1}) {
        const int a = axis < 0 ? axis + 2 : axis;
        HostArr sm = h, lsm = h;
        test::for_each_index(s, [&](const std::vector<int64_t>& idx) {
          double mx = -1e300, total = 0;
          for (int64_t k = 0; k < s[static_cast<size_t>(a)]; ++k) {
            auto j = idx;
            j[static_cast<size_t>(a)] = k;
            mx = std::max(mx, h.v[static_cast<size_t>(h.at(j))]);
          }
          for (int64_t k = 0; k < s[static_cast<size_t>(a)]; ++k) {
            auto j = idx;
            j[static_cast<size_t>(a)] = k;
            total += std::exp(h.v[static_cast<size_t>(h.at(j))] - mx);
          }
          const double v = h.v[static_cast<size_t>(h.at(idx))];
          sm.v[static_cast<size_t>(sm.at(idx))] = std::exp(v - mx) / total;
          lsm.v[static_cast<size_t>(lsm.at(idx))] = v - mx - std::log(total);
        });
        const DType out = float_dtype_for(dt);
        expect_close(softmax(make(h, dt, dev_), axis), sm, out, true, "softmax");
        expect_close(log_softmax(make(h, dt, dev_), axis), lsm, out, true, "log_softmax");
      }
    }
  }
}

// ---- linear algebra

HostArr ref_matmul(const HostArr& a, const HostArr& b) {  // 2-D
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[1];
  HostArr c = test::make_arr({m, n});
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t q = 0; q < k; ++q)
        acc += a.v[static_cast<size_t>(i * k + q)] * b.v[static_cast<size_t>(q * n + j)];
      c.v[static_cast<size_t>(i * n + j)] = acc;
    }
  }
  return c;
}

TEST_P(Ops, Matmul) {
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64}) {
    for (int rep = 0; rep < 10; ++rep) {
      const int64_t m = rng_() % 9, k = rng_() % 9, n = rng_() % 9;
      HostArr a = random_arr(rng_, {m, k}, dt), b = random_arr(rng_, {k, n}, dt);
      expect_close(matmul(make(a, dt, dev_), make(b, dt, dev_)), ref_matmul(a, b), dt, true,
                   "matmul " + shape_str(a.shape) + shape_str(b.shape));
    }
  }
  // Batched with a broadcast batch dimension, and 1-D operands.
  HostArr a = random_arr(rng_, {3, 2, 4, 5}, DType::f32),
          b = random_arr(rng_, {2, 5, 3}, DType::f32);
  Tensor c = matmul(make(a, DType::f32, dev_), make(b, DType::f32, dev_));
  ASSERT_EQ(c.shape(), (Shape{3, 2, 4, 3}));
  std::vector<double> cv = values(c);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 2; ++j) {
      HostArr a2 = test::make_arr({4, 5}), b2 = test::make_arr({5, 3});
      std::copy_n(a.v.begin() + (i * 2 + j) * 20, 20, a2.v.begin());
      std::copy_n(b.v.begin() + j * 15, 15, b2.v.begin());
      HostArr w = ref_matmul(a2, b2);
      for (size_t e = 0; e < 12; ++e)
        EXPECT_NEAR(cv[static_cast<size_t>((i * 2 + j) * 12) + e], w.v[e], 1e-5) << i << j;
    }
  }
  HostArr v = random_arr(rng_, {5}, DType::f64), mtx = random_arr(rng_, {5, 3}, DType::f64);
  HostArr v2 = v;
  v2.shape = {1, 5};
  HostArr want = ref_matmul(v2, mtx);
  want.shape = {3};
  expect_close(matmul(make(v, DType::f64, dev_), make(mtx, DType::f64, dev_)), want, DType::f64,
               true, "vec @ mat");
  HostArr d = test::make_arr({});
  for (size_t i = 0; i < 5; ++i) d.v[0] += v.v[i] * v.v[i];
  expect_close(dot(make(v, DType::f64, dev_), make(v, DType::f64, dev_)), d, DType::f64, true,
               "dot 1-D");
  EXPECT_MESHRT_ERROR(matmul(ones({2, 3}, DType::f32, dev_), ones({4, 5}, DType::f32, dev_)),
                      "[ops] matmul", "(2, 3) and (4, 5) do not align", "last dimension (size 3)",
                      "second-to-last dimension (size 4)");
  EXPECT_MESHRT_ERROR(matmul(ones({}, DType::f32, dev_), ones({2}, DType::f32, dev_)),
                      "at least 1-D");
  EXPECT_MESHRT_ERROR(dot(ones({2, 3, 4}, DType::f32, dev_), ones({4, 2, 2}, DType::f32, dev_)),
                      "[ops] dot");
}

// matmul_transposed against matmul of explicit transposes: floats and integers (no BLAS),
// batched with broadcasting, each operand transposed or not.
TEST_P(Ops, MatmulTransposed) {
  auto swapped = [](const Tensor& t) {
    std::vector<int> perm(static_cast<size_t>(t.ndim()));
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
    return transpose(t, perm);
  };
  for (DType dt : {DType::f64, DType::i32}) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = (flags & 1) != 0, tb = (flags & 2) != 0;
      const Shape sa = ta ? Shape{2, 7, 5} : Shape{2, 5, 7};  // read as (2, 5, 7)
      const Shape sb = tb ? Shape{6, 7} : Shape{7, 6};        // read as (7, 6), broadcast
      Tensor a = make(random_arr(rng_, sa, dt), dt, dev_);
      Tensor b = make(random_arr(rng_, sb, dt), dt, dev_);
      Tensor got = matmul_transposed(a, b, ta, tb);
      Tensor want = matmul(ta ? swapped(a) : a, tb ? swapped(b) : b);
      ASSERT_EQ(got.shape(), want.shape());
      if (dt == DType::i32) {
        EXPECT_EQ(got.to_vector<int32_t>(), want.to_vector<int32_t>()) << flags;
      } else {
        const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
        for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-12) << flags << " " << i;
      }
    }
  }
}

// `n` floats uniform in [-1, 1).
std::vector<float> uniform_floats(std::mt19937& rng, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : v) x = u(rng);
  return v;
}

// Matmul precision: highest is true fp32 everywhere; tf32 on cuda rounds f32 operands to TF32
// (10-bit mantissa, error per product term <= 2^-10 of |a||b| with f32 accumulation), on cpu it
// computes in full precision (the same bits as highest). Per-call options override the default,
// and a backward pass multiplies at its forward product's precision.
TEST_P(Ops, MatmulPrecision) {
  const Precision saved = default_matmul_precision();
  EXPECT_EQ(saved, Precision::highest) << "MESHRT_MATMUL_PRECISION unset: the default is highest";
  const int64_t m = 64, k = 512, n = 48;
  const std::vector<float> ha = uniform_floats(rng_, m * k), hb = uniform_floats(rng_, k * n);
  const Tensor a = tensor(ha, {m, k}, dev_), b = tensor(hb, {k, n}, dev_);
  // The f64 reference and each element's scale sum_k |a||b|.
  std::vector<double> ref(static_cast<size_t>(m * n)), scale(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double r = 0, sc = 0;
      for (int64_t q = 0; q < k; ++q) {
        const double x = ha[static_cast<size_t>(i * k + q)], y = hb[static_cast<size_t>(q * n + j)];
        r += x * y;
        sc += std::abs(x * y);
      }
      ref[static_cast<size_t>(i * n + j)] = r;
      scale[static_cast<size_t>(i * n + j)] = sc;
    }
  }
  // max over elements of |got - ref| / scale.
  auto rel_err = [&](const Tensor& t) {
    const std::vector<float> g = t.to_vector<float>();
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(g[i]) - ref[i]) / scale[i]);
    }
    return worst;
  };
  const Tensor hi = matmul(a, b);
  const Tensor tf = matmul(a, b, {.precision = Precision::tf32});
  EXPECT_LT(rel_err(hi), 1e-6) << "highest is true fp32";
  const double tf_err = rel_err(tf);
  EXPECT_LT(tf_err, 2.0 * std::ldexp(1.0, -10)) << "tf32: operands rounded to 10 mantissa bits";
  if (GetParam() == "cpu") {
    EXPECT_EQ(tf.to_vector<float>(), hi.to_vector<float>()) << "cpu computes full precision";
  } else {
    EXPECT_GT(tf_err, 1e-5) << "tf32 on a GPU must actually use TF32 (its error is ~1e-4)";
  }
  // The default: tf32 for calls that do not choose, per-call highest still wins; restored after.
  set_default_matmul_precision(Precision::tf32);
  EXPECT_EQ(matmul(a, b).to_vector<float>(), tf.to_vector<float>());
  EXPECT_EQ(matmul(a, b, {.precision = Precision::highest}).to_vector<float>(),
            hi.to_vector<float>());
  // A transposed read takes another cuBLAS kernel (another summation order): same tolerance, and
  // still TF32 on a GPU (an H200 gave a few last-bit differences from the untransposed product).
  const double tf_t_err = rel_err(matmul_transposed(transpose(a), b, true, false));
  EXPECT_LT(tf_t_err, 2.0 * std::ldexp(1.0, -10));
  if (GetParam() != "cpu") EXPECT_GT(tf_t_err, 1e-5);
  set_default_matmul_precision(saved);
  EXPECT_EQ(matmul(a, b).to_vector<float>(), hi.to_vector<float>());
  // f64 ignores tf32.
  const Tensor a64 = astype(a, DType::f64), b64 = astype(b, DType::f64);
  EXPECT_EQ(matmul(a64, b64, {.precision = Precision::tf32}).to_vector<double>(),
            matmul(a64, b64).to_vector<double>());
  EXPECT_EQ(precision_name(Precision::tf32), "tf32");
}

// MESHRT_MATMUL_PRECISION is read through the one config table: a wrong value names the choices.
TEST(MatmulPrecisionVariable, NamesTheChoices) {
  setenv("MESHRT_MATMUL_PRECISION", "tf33", 1);
  try {
    (void)config::matmul_tf32();
    ADD_FAILURE() << "tf33 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MESHRT_MATMUL_PRECISION"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tf32"), std::string::npos) << e.what();
  }
  setenv("MESHRT_MATMUL_PRECISION", "tf32", 1);
  EXPECT_TRUE(config::matmul_tf32());
  unsetenv("MESHRT_MATMUL_PRECISION");
  EXPECT_FALSE(config::matmul_tf32());
}

// value_and_grad of a tf32 product: both cotangent products at tf32, whatever the default.
TEST_P(Ops, MatmulPrecisionReachesTheBackwardPass) {
  const int64_t m = 32, k = 256, n = 16;
  const std::vector<float> ha = uniform_floats(rng_, m * k), hb = uniform_floats(rng_, k * n);
  const Tensor a = tensor(ha, {m, k}, dev_), b = tensor(hb, {k, n}, dev_);
  const Tensor g = tensor(std::vector<float>(static_cast<size_t>(m * n), 1.0f), {m, n}, dev_);
  auto [y, pullback] = vjp(
      [](const Tensor& x, const Tensor& w) { return matmul(x, w, {.precision = Precision::tf32}); },
      a, b);
  auto [ga, gb] = pullback(g);
  const MatmulOptions tf{Precision::tf32};
  EXPECT_EQ(ga.to_vector<float>(), matmul_transposed(g, b, false, true, tf).to_vector<float>());
  EXPECT_EQ(gb.to_vector<float>(), matmul_transposed(a, g, true, false, tf).to_vector<float>());
}

TEST_P(Ops, Transpose) {
  // transpose(random values of shape s and dtype dt, perm) against the host's permutation.
  auto check = [&](const Shape& s, const std::vector<int>& perm, DType dt, const char* what) {
    HostArr h = random_arr(rng_, s, dt);
    Shape out;
    for (int p : perm) out.push_back(s[static_cast<size_t>(p)]);
    HostArr want = test::make_arr(out);
    test::for_each_index(out, [&](const std::vector<int64_t>& idx) {
      std::vector<int64_t> src(s.size());
      for (size_t d = 0; d < perm.size(); ++d) src[static_cast<size_t>(perm[d])] = idx[d];
      want.v[static_cast<size_t>(want.at(idx))] = h.v[static_cast<size_t>(h.at(src))];
    });
    expect_close(transpose(make(h, dt, dev_), perm), want, dt, false, what);
  };
  for (int rep = 0; rep < 20; ++rep) {
    Shape s = random_shape(rng_, 4);
    std::vector<int> perm(s.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    check(s, perm, DType::i64, "transpose");
  }
  // Shapes whose last two output dims read the input transposed and are at least a tile (32)
  // wide: the kernel copies them tile by tile (with leading dims of any order before them).
  const std::vector<std::pair<Shape, std::vector<int>>> tiled = {
      {{70, 45}, {1, 0}}, {{3, 40, 33}, {0, 2, 1}}, {{2, 33, 5, 64}, {2, 0, 3, 1}}};
  for (const auto& [s, perm] : tiled) {
    for (DType dt : {DType::f32, DType::i64}) check(s, perm, dt, "tiled transpose");
  }
  EXPECT_EQ(transpose(ones({2, 3, 4}, DType::f32, dev_)).shape(), (Shape{4, 3, 2}));
  EXPECT_MESHRT_ERROR(transpose(ones({2, 3}, DType::f32, dev_), {0, 0}), "[ops] transpose",
                      "not a permutation");
  EXPECT_MESHRT_ERROR(transpose(ones({2, 3}, DType::f32, dev_), {0}), "not a permutation");
}

// ---- shape ops

TEST_P(Ops, ReshapeSqueezeExpand) {
  Tensor x = arange(24, DType::f32, dev_);
  Tensor r = reshape(x, {2, -1, 4});
  EXPECT_EQ(r.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(r.data(), x.data());  // a view: no copy
  EXPECT_EQ(values(r), values(x));
  EXPECT_EQ(squeeze(ones({1, 3, 1}, DType::f32, dev_)).shape(), (Shape{3}));
  EXPECT_EQ(squeeze(ones({1, 3, 1}, DType::f32, dev_), {-1}).shape(), (Shape{1, 3}));
  EXPECT_EQ(expand_dims(ones({3}, DType::f32, dev_), -1).shape(), (Shape{3, 1}));
  EXPECT_EQ(expand_dims(ones({3}, DType::f32, dev_), 0).shape(), (Shape{1, 3}));
  EXPECT_MESHRT_ERROR(reshape(x, {5, 5}), "[ops] reshape", "(24,)", "(5, 5)");
  EXPECT_MESHRT_ERROR(reshape(x, {-1, -1}), "only one dimension may be -1");
  EXPECT_MESHRT_ERROR(reshape(x, {7, -1}), "cannot reshape");
  EXPECT_MESHRT_ERROR(squeeze(ones({2, 3}, DType::f32, dev_), {0}), "[ops] squeeze",
                      "size not equal to one");
  EXPECT_MESHRT_ERROR(expand_dims(ones({3}, DType::f32, dev_), 3), "[ops] expand_dims",
                      "out of bounds");
}

TEST_P(Ops, Slicing) {
  HostArr h = random_arr(rng_, {5, 6, 3}, DType::f64);
  Tensor x = make(h, DType::f64, dev_);
  auto ref_slice = [&](Shape start, Shape limit, Shape step) {
    Shape out;
    for (size_t d = 0; d < 3; ++d) out.push_back((limit[d] - start[d] + step[d] - 1) / step[d]);
    HostArr w = test::make_arr(out);
    test::for_each_index(out, [&](const std::vector<int64_t>& idx) {
      std::vector<int64_t> src(3);
      for (size_t d = 0; d < 3; ++d) src[d] = start[d] + idx[d] * step[d];
      w.v[static_cast<size_t>(w.at(idx))] = h.v[static_cast<size_t>(h.at(src))];
    });
    return w;
  };
  expect_close(slice(x, {1, 0, 1}, {4, 6, 3}), ref_slice({1, 0, 1}, {4, 6, 3}, {1, 1, 1}),
               DType::f64, false, "slice");
  expect_close(slice(x, {0, 1, 0}, {5, 6, 3}, {2, 3, 1}),
               ref_slice({0, 1, 0}, {5, 6, 3}, {2, 3, 1}), DType::f64, false, "strided slice");
  expect_close(slice_in_dim(x, 2, 5, 1, -2), ref_slice({0, 2, 0}, {5, 5, 3}, {1, 1, 1}), DType::f64,
               false, "slice_in_dim");
  // dynamic_slice_in_dim: the start is clamped so the slice fits (lax semantics).
  expect_close(dynamic_slice_in_dim(x, 4, 3, 1), ref_slice({0, 3, 0}, {5, 6, 3}, {1, 1, 1}),
               DType::f64, false, "dynamic_slice clamped");
  expect_close(dynamic_slice_in_dim(x, -7, 2, 0), ref_slice({0, 0, 0}, {2, 6, 3}, {1, 1, 1}),
               DType::f64, false, "dynamic_slice clamped low");
  for (int64_t i = 0; i < 3; ++i) {  // the seed's lax.dynamic_slice_in_dim(x, i*B, B, 1)
    expect_close(dynamic_slice_in_dim(x, i * 2, 2, 1),
                 ref_slice({0, i * 2, 0}, {5, i * 2 + 2, 3}, {1, 1, 1}), DType::f64, false,
                 "dynamic_slice block");
  }
  // dynamic_update_slice, clamped too.
  Tensor z = zeros({5}, DType::f32, dev_);
  EXPECT_EQ(values(dynamic_update_slice(z, ones({3}, DType::f32, dev_), {4})),
            (std::vector<double>{0, 0, 1, 1, 1}));
  EXPECT_EQ(values(dynamic_update_slice(z, ones({2}, DType::f32, dev_), {1})),
            (std::vector<double>{0, 1, 1, 0, 0}));
  EXPECT_EQ(values(z), std::vector<double>(5, 0.0));  // inputs are never modified
  EXPECT_MESHRT_ERROR(slice(x, {0, 0, 0}, {6, 6, 3}), "[ops] slice", "do not fit shape (5, 6, 3)");
  EXPECT_MESHRT_ERROR(slice(x, {0, 0}, {1, 1}), "one entry per dimension");
  EXPECT_MESHRT_ERROR(dynamic_slice_in_dim(x, 0, 7, 0), "[ops] dynamic_slice_in_dim",
                      "size 7 does not fit");
  EXPECT_MESHRT_ERROR(dynamic_update_slice(z, ones({6}, DType::f32, dev_), {0}),
                      "[ops] dynamic_update_slice", "larger than");
}

TEST_P(Ops, ConcatenateSplitStackPad) {
  HostArr a = random_arr(rng_, {2, 3}, DType::i32), b = random_arr(rng_, {2, 1}, DType::i32);
  Tensor ta = make(a, DType::i32, dev_), tb = make(b, DType::i32, dev_);
  Tensor c = concatenate({ta, tb, ta}, -1);
  ASSERT_EQ(c.shape(), (Shape{2, 7}));
  std::vector<double> cv = values(c);
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<double> row(cv.begin() + r * 7, cv.begin() + r * 7 + 7), want;
    for (int64_t j = 0; j < 3; ++j) want.push_back(a.v[static_cast<size_t>(r * 3 + j)]);
    want.push_back(b.v[static_cast<size_t>(r)]);
    for (int64_t j = 0; j < 3; ++j) want.push_back(a.v[static_cast<size_t>(r * 3 + j)]);
    EXPECT_EQ(row, want);
  }
  EXPECT_EQ(concatenate({ta, astype(ta, DType::f32)}).dtype(), DType::f32);
  std::vector<Tensor> parts = split(c, 7, 1);
  ASSERT_EQ(parts.size(), 7u);
  EXPECT_EQ(values(parts[3]), values(tb));
  Tensor s = stack({ta, ta * 2}, 1);
  EXPECT_EQ(s.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(values(slice_in_dim(s, 1, 2, 1, 1)), values(ta * 2));
  Tensor p = pad(tb, {{1, 2}, {0, 1}}, -1.0);
  EXPECT_EQ(p.shape(), (Shape{5, 2}));
  EXPECT_EQ(values(p), (std::vector<double>{-1, -1, b.v[0], -1, b.v[1], -1, -1, -1, -1, -1}));
  EXPECT_EQ(concatenate({zeros({0, 3}, DType::f32, dev_), ones({2, 3}, DType::f32, dev_)}).shape(),
            (Shape{2, 3}));
  EXPECT_MESHRT_ERROR(concatenate({ta, ones({3, 3}, DType::i32, dev_)}, 1), "[ops] concatenate",
                      "(2, 3) and (3, 3)");
  EXPECT_MESHRT_ERROR(concatenate(std::vector<Tensor>{}), "at least one");
  EXPECT_MESHRT_ERROR(split(ta, 2, 1), "[ops] split", "equal division");
  EXPECT_MESHRT_ERROR(stack({ta, tb}), "[ops] stack", "same shape");
  EXPECT_MESHRT_ERROR(pad(ta, {{1, 1}}), "[ops] pad", "one per dimension");
  EXPECT_MESHRT_ERROR(pad(ta, {{1, 1}, {-1, 0}}), ">= 0");
}

// Conveniences a user reaches for, with the semantics of their Array counterparts
// (global/array_ops.h) and of JAX: compound assignment rebinds, comparisons take weak scalars,
// t[i] is a row.
TEST_P(Ops, CompoundAssignmentComparisonsAndRows) {
  Tensor t = tensor(std::vector<float>{-1.5f, 0.f, 2.f, 3.f}, {4}, dev_);
  const Tensor before = t;
  t += 1.0;
  EXPECT_EQ(values(t), (std::vector<double>{-0.5, 1, 3, 4}));
  EXPECT_EQ(values(before), (std::vector<double>{-1.5, 0, 2, 3}));  // other copies keep theirs
  t -= tensor(std::vector<float>{1.f, 1.f, 1.f, 1.f}, {4}, dev_);
  t *= 2;
  t /= 4.0;
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(values(t), (std::vector<double>{-0.75, 0, 1, 1.5}));
  Tensor m = ones({2, 4}, DType::f32, dev_);
  m *= t;  // broadcasts, as m = m * t
  m += m;
  EXPECT_EQ(m.shape(), (Shape{2, 4}));
  EXPECT_EQ(values(m), (std::vector<double>{-1.5, 0, 2, 3, -1.5, 0, 2, 3}));
  Tensor q = full({2}, 7.0, DType::f64, dev_);
  q -= 1;
  q /= full({2}, 4.0, DType::f64, dev_);
  EXPECT_EQ(values(q), (std::vector<double>{1.5, 1.5}));
  Tensor i = arange(4, DType::i32, dev_);
  i += 1;
  EXPECT_EQ(i.dtype(), DType::i32);
  i /= 2;  // true division: int32 -> float32, as jnp (i = i / 2)
  EXPECT_EQ(i.dtype(), DType::f32);
  EXPECT_EQ(values(i), (std::vector<double>{0.5, 1, 1.5, 2}));
  Tensor w = arange(3, DType::i32, dev_);
  w *= 0.5;  // a double scalar turns integers into float64
  EXPECT_EQ(w.dtype(), DType::f64);

  // Comparisons with scalars give bool; the scalar is weakly typed as in arithmetic.
  const Tensor x = tensor(std::vector<float>{-1.f, 0.f, 1.f, 2.5f}, {2, 2}, dev_);
  EXPECT_EQ((x > 0.0).dtype(), DType::bool_);
  EXPECT_EQ((x > 0.0).shape(), (Shape{2, 2}));
  EXPECT_EQ(values(x > 0.0), (std::vector<double>{0, 0, 1, 1}));
  EXPECT_EQ(values(x == 1), (std::vector<double>{0, 0, 1, 0}));
  EXPECT_EQ(values(x != 1), (std::vector<double>{1, 1, 0, 1}));
  EXPECT_EQ(values(x < 0), (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(values(x <= 1.0), (std::vector<double>{1, 1, 1, 0}));
  EXPECT_EQ(values(x >= 2.5), (std::vector<double>{0, 0, 0, 1}));
  EXPECT_EQ(values(0.0 < x), values(x > 0.0));  // scalar on the left
  EXPECT_EQ(values(1 == x), values(x == 1));
  EXPECT_EQ(values(2.5 <= x), values(x >= 2.5));
  EXPECT_EQ(values(0 >= x), values(x <= 0));
  EXPECT_EQ(values(1.0 != x), values(x != 1.0));
  EXPECT_EQ(values(0 > x), values(x < 0));
  const Tensor xi = arange(4, DType::i32, dev_);
  EXPECT_EQ(values(xi == 1), (std::vector<double>{0, 1, 0, 0}));
  EXPECT_EQ(values(xi > 1.5), (std::vector<double>{0, 0, 1, 1}));
  // jnp.float32(0.1) == 0.1 is True (the scalar takes float32); an int32 against a double compares
  // in float64 (jnp.int32(16777217) == 16777216.0 is False, where float32 would round both).
  EXPECT_EQ(values(full({1}, 0.1, DType::f32, dev_) == 0.1), (std::vector<double>{1}));
  EXPECT_EQ(values(full({1}, 16777217, DType::i32, dev_) == 16777216.0), (std::vector<double>{0}));
  const Tensor xb = xi > 1;
  EXPECT_EQ(values(xb == 1), (std::vector<double>{0, 0, 1, 1}));
  EXPECT_EQ(values(xb != true), (std::vector<double>{1, 1, 0, 0}));
  const Tensor nan = full({1}, std::numeric_limits<double>::quiet_NaN(), DType::f32, dev_);
  EXPECT_EQ(values(nan == nan), (std::vector<double>{0}));
  EXPECT_EQ(values(nan != 0.0), (std::vector<double>{1}));
  EXPECT_EQ(values(nan > 0.0), (std::vector<double>{0}));
  EXPECT_EQ(values(where(x > 0.0, x, 0.0 * x)), (std::vector<double>{0, 0, 1, 2.5}));

  // t[i]: row i of the leading dimension, negative from the end, a view of t's block.
  const Tensor r = reshape(arange(24, DType::f64, dev_), {2, 3, 4});
  EXPECT_EQ(r[1].shape(), (Shape{3, 4}));
  EXPECT_EQ(values(r[0][2]), (std::vector<double>{8, 9, 10, 11}));
  EXPECT_EQ(values(r[-1][-3]), (std::vector<double>{12, 13, 14, 15}));
  EXPECT_EQ(values(r[1][2][3]), (std::vector<double>{23}));
  EXPECT_EQ(r[1][2][3].shape(), Shape{});
  EXPECT_EQ(detail::TensorAccess::buffer(r[1]), detail::TensorAccess::buffer(r));
  EXPECT_EQ(values(row(r, -2)), values(r[0]));
  const Tensor v = arange(5, DType::i64, dev_);
  EXPECT_EQ(values(v[-1]), (std::vector<double>{4}));
  EXPECT_EQ(v[4].dtype(), DType::i64);
  EXPECT_MESHRT_ERROR(r[2], "[ops] t[2]: index 2 is out of bounds for axis 0 with size 2");
  EXPECT_MESHRT_ERROR(r[-3], "[ops] t[-3]: index -3 is out of bounds for axis 0 with size 2");
  EXPECT_MESHRT_ERROR(row(v, 5), "[ops] row: index 5 is out of bounds for axis 0 with size 5");
  EXPECT_MESHRT_ERROR(v[0][0], "[ops] t[0]: indexing a 0-d tensor");
  EXPECT_MESHRT_ERROR(Tensor()[0], "empty (default-constructed) Tensor");
  EXPECT_MESHRT_ERROR(zeros({0, 3}, DType::f32, dev_)[0], "out of bounds for axis 0 with size 0");

  // The same values as the Array forms on a one-device array.
  const SingleDeviceSharding one(dev_);
  Array a = device_put(x, one);
  EXPECT_EQ((a > 0.0).to_vector<bool>(), (x > 0.0).to_vector<bool>());
  EXPECT_EQ((a == 1).to_vector<bool>(), (x == 1).to_vector<bool>());
  EXPECT_EQ(a[-1].to_vector<float>(), x[-1].to_vector<float>());
  Tensor tx = x;
  tx *= 3.0;
  tx -= 1;
  a *= 3.0;
  a -= 1;
  EXPECT_EQ(a.to_vector<float>(), tx.to_vector<float>());
}

TEST_P(Ops, InsideShardMapBodies) {
  // The MLP pattern: ops on each device's block, then a collective.
  if (const std::string why = test::too_few_devices(4, GetParam()); !why.empty())
    GTEST_SKIP() << why;
  Mesh mesh = make_mesh({4}, {"x"}, GetParam());
  std::vector<float> host(4 * 3 * 2);
  std::iota(host.begin(), host.end(), 0.f);
  Array x = device_put(host, {12, 2}, NamedSharding(mesh, P("x")));
  Array y = shard_map(
      [](Context& ctx, const Tensor& b) {
        Tensor h = relu(matmul(b, ones({2, 2}, DType::f32, ctx.device())) - 10.0);
        return ctx.psum(sum(h, 0, true), "x");
      },
      mesh, {P("x")}, P())(x);
  std::vector<float> want(2, 0.f);
  for (int r = 0; r < 12; ++r) {
    float rowsum = host[static_cast<size_t>(2 * r)] + host[static_cast<size_t>(2 * r + 1)];
    want[0] += std::max(rowsum - 10.f, 0.f);
  }
  want[1] = want[0];
  EXPECT_EQ(y.to_vector<float>(), want);
}

// test::host_bytes reads a tensor's elements through copy_to_host (the tests' bit-for-bit
// comparisons use it on every platform): the bytes of to_vector, views included, -0 and NaN kept.
TEST_P(Ops, HostBytesAreTheElementsBits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> v{1.5f, -0.0f, 0.0f, nan, -3.25f, 1e-40f};
  const Tensor t = tensor(v, {3, 2}, dev_);
  auto bytes_of = [](const std::vector<float>& f) {
    std::vector<unsigned char> b(f.size() * sizeof(float));
    std::memcpy(b.data(), f.data(), b.size());
    return b;
  };
  EXPECT_EQ(test::host_bytes(t), bytes_of(v));
  EXPECT_EQ(test::host_bytes(t[1]), bytes_of({0.0f, nan}));
  EXPECT_NE(test::host_bytes(t[0]), test::host_bytes(t[0] + 0.0))  // -0 + 0 is +0
      << "host_bytes must tell -0 from +0";
  EXPECT_TRUE(test::host_bytes(tensor(std::vector<int32_t>{}, {0}, dev_)).empty());
}

// Named by platform (Platforms/Ops.Creation/cuda): the cuda runs' CUDA_FILTER selects "*/cuda".
INSTANTIATE_TEST_SUITE_P(Platforms, Ops, ::testing::Values("cpu", "cuda"),
                         test::platform_param_name);

// The dimension merging the cuda kernels launch with (backends/merge_dims.h) must visit exactly
// the operand offsets of the unmerged iteration, in the same order: random shapes with dense,
// broadcast, transposed and sliced operands, and the rank it reaches for the usual cases.
std::vector<std::vector<int64_t>> visit(const std::vector<int64_t>& shape,
                                        const std::vector<std::vector<int64_t>>& strides) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n),
                                        std::vector<int64_t>(strides.size(), 0));
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i;
    for (size_t d = shape.size(); d-- > 0;) {
      const int64_t idx = rem % shape[d];
      rem /= shape[d];
      for (size_t k = 0; k < strides.size(); ++k)
        out[static_cast<size_t>(i)][k] += idx * strides[k][d];
    }
  }
  return out;
}

// test::ulp_distance, the tests' measure for transcendental results: steps between
// representable values, across zero, binades and subnormals.
TEST(TestUtil, UlpDistanceCountsRepresentableSteps) {
  using test::ulp_distance;
  EXPECT_EQ(ulp_distance(1.0f, 1.0f), 0);
  EXPECT_EQ(ulp_distance(0.0f, -0.0f), 0);
  EXPECT_EQ(ulp_distance(1.0f, std::nextafter(1.0f, 2.0f)), 1);
  EXPECT_EQ(ulp_distance(std::nextafter(1.0f, 0.0f), std::nextafter(1.0f, 2.0f)), 2);  // a binade
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(ulp_distance(-tiny, tiny), 2);
  EXPECT_EQ(ulp_distance(-0.08804214f, -0.088042259f), 16);  // the first GPU run's sinf case
  EXPECT_EQ(ulp_distance(-1.0f, 1.0f), 2 * int64_t{0x3f800000});
  EXPECT_EQ(ulp_distance(1.0, std::nextafter(1.0, 2.0)), 1);
  EXPECT_EQ(ulp_distance(-std::numeric_limits<double>::max(), std::numeric_limits<double>::max()),
            std::numeric_limits<int64_t>::max());  // clamped
  EXPECT_EQ(ulp_distance(std::nanf(""), std::nanf("")), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ulp_distance(1.0f, std::numeric_limits<float>::quiet_NaN()),
            std::numeric_limits<int64_t>::max());
}

TEST(MergeDims, VisitsTheSameOffsetsWithFewerDimensions) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t rank = rng() % 6;
    std::vector<int64_t> shape(rank);
    for (int64_t& d : shape) d = static_cast<int64_t>(rng() % 4) + (trial % 7 == 0 ? 0 : 1);
    std::vector<std::vector<int64_t>> strides;
    for (int k = 0; k < 3; ++k) {
      std::vector<int64_t> dense(rank);
      int64_t acc = (rng() % 3 == 0) ? 2 : 1;  // sometimes a strided slice
      for (size_t d = rank; d-- > 0;) {
        dense[d] = acc;
        acc *= shape[d] + static_cast<int64_t>(rng() % 2);  // sometimes padded rows
      }
      for (int64_t& s : dense) {
        if (rng() % 4 == 0) s = 0;  // broadcast along this dimension
      }
      if (rank > 1 && rng() % 3 == 0) std::swap(dense[0], dense[rank - 1]);  // transposed
      strides.push_back(dense);
    }
    std::vector<const std::vector<int64_t>*> ptrs;
    for (const auto& s : strides) ptrs.push_back(&s);
    const backend::MergedDims m = backend::merge_dims(shape, ptrs);
    EXPECT_LE(m.size.size(), rank);
    int64_t total = 1;
    for (int64_t d : shape) total *= d;
    if (total == 0) continue;
    EXPECT_EQ(visit(m.size, m.strides), visit(shape, strides)) << "trial " << trial;
  }
  // A dense operand and a broadcast row of a (2, 3, 4) shape: two dimensions.
  std::vector<int64_t> dense{12, 4, 1}, row{0, 0, 1};
  const backend::MergedDims m = backend::merge_dims({2, 3, 4}, {&dense, &row});
  EXPECT_EQ(m.size, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(m.strides[0], (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(m.strides[1], (std::vector<int64_t>{0, 1}));
}

}  // namespace
}  // namespace meshrt
