// The cuda backend's kernels, driven through the backend interface, against the cpu backend's
// kernels on the same inputs: every unary op and astype, every binary op, select, reductions and
// matmul_t, across dtypes and operand layouts (dense, broadcast scalar, row and column, genuinely
// strided, odd element counts, pointers off 16-byte alignment), so each kernel path is taken.
//
// Tolerances: integers and bools bit-equal everywhere; float elementwise ops bit-equal (a NaN
// matches any NaN: x86 and the GPU give NaNs different payloads), except exp, log, sin, cos, tanh
// (within 2 ulp, tanh 4: two math libraries). Float sums of integer-valued data are exact in any
// order, so bit-equal; sums of random data fold in another order than cpu's and agree within 1e-5 *
// sum|x| (f32) or 1e-13 * sum|x| (f64). max/min compare as values (NaN with NaN; +0 and -0 are
// equal, their order is not fixed), argmax indices exactly. Matmuls of small integers are exact in
// every order: bit-equal; of random floats within 1e-5 (f32) or 1e-13 (f64) of sum_k |a||b|.
//
// bfloat16 and float16 take every test above (computed in float32 and rounded once per stored
// result, as the cpu kernels): bit-equal for conversions, +, -, *, /, comparisons, select,
// max/min, integer-valued sums and every collective fold (the same left-to-right order in float32,
// one rounding); exp, log, sin, cos, tanh within 1 ulp of the 16-bit type (the float32 results
// differ by the ulps above, which can move a rounding by one); sums of random data within 1e-5 *
// sum|x| plus one 16-bit ulp; matmuls of small integers bit-equal, of random values (cuBLAS with
// float32 accumulation, another order than the cpu's) within 1e-5 * sum_k |a||b| plus one 16-bit
// ulp. Conversion corner cases (ties, subnormals, NaN, +-Inf, float16 overflow, double and
// integer inputs rounded through float32) are also checked against fixed bits.
//
// Runs in the cuda_k1 entries (MESHRT_PLATFORM=cuda); elsewhere, or without a usable GPU, skips.
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "core/config.h"
#include "runtime/detail/platform.h"

namespace meshrt {
namespace {

using backend::Backend;
using backend::BinaryOp;
using backend::ReduceOp;
using backend::Strided;
using backend::UnaryOp;

constexpr DType kDTypes[] = {DType::f32,   DType::f64,  DType::i32, DType::i64,
                             DType::bool_, DType::bf16, DType::f16};
constexpr DType kNumeric[] = {DType::f32, DType::f64,  DType::i32,
                              DType::i64, DType::bf16, DType::f16};
constexpr DType kHalves[] = {DType::bf16, DType::f16};

// Host bytes of n elements of one dtype.
struct Host {
  DType t = DType::f32;
  std::vector<unsigned char> bytes;
  int64_t n() const { return static_cast<int64_t>(bytes.size() / dtype_size(t)); }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};
Host make(DType t, int64_t n) { return Host{t, std::vector<unsigned char>(n * dtype_size(t))}; }

template <class F>
void visit(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::bool_:
      return f(bool{});
    case DType::bf16:
      return f(bfloat16{});
    case DType::f16:
      return f(float16{});
  }
}

// Float-like helpers over float, double, bfloat16 and float16.
template <class T>
inline constexpr bool kFloatLike = std::is_floating_point_v<T> || is_half_v<T>;
template <class T>
double as_double(T v) {
  return static_cast<double>(v);
}
template <class T>
bool nan_of(T v) {
  return std::isnan(as_double(v));
}
// A value for printing (halves as their float value).
template <class T>
auto shown(T v) {
  if constexpr (is_half_v<T>)
    return static_cast<float>(v);
  else
    return +v;
}
// The spacing of the 16-bit type at |v| (an upper bound on one ulp), for tolerances.
template <class T>
double half_ulp_at(double v) {
  const double rel = std::is_same_v<T, bfloat16> ? 0x1p-7 : 0x1p-10;
  const double tiny = std::is_same_v<T, bfloat16> ? 0x1p-133 : 0x1p-24;
  return std::max(std::abs(v) * rel, tiny);
}

// How values are drawn: kMixed (floats in [-4, 4] with NaN, +-inf and +-0 sprinkled in; integers
// over their whole range half the time, else small, so adds wrap and compares meet equals),
// kSmallInts (integers in [-8, 8], also for floats: exact sums), kUnit (floats in [-1, 1]),
// kTies (few distinct values, NaN in some elements, for max/min/argmax).
enum class Fill { kMixed, kSmallInts, kUnit, kTies };

Host random(DType t, int64_t n, std::mt19937_64& rng, Fill fill) {
  Host h = make(t, n);
  std::uniform_int_distribution<int> small(-8, 8), pick(0, 99);
  std::uniform_real_distribution<double> real(-4.0, 4.0), unit(-1.0, 1.0);
  visit(t, [&](auto tv) {
    using T = decltype(tv);
    T* p = h.as<T>();
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, bool>) {
        p[i] = (rng() & 1) != 0;
      } else if constexpr (is_half_v<T>) {
        // The float recipe below, rounded to the 16-bit type.
        const int r = pick(rng);
        constexpr float kInf = std::numeric_limits<float>::infinity();
        constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
        float v = 0;
        switch (fill) {
          case Fill::kMixed:
            v = r == 0   ? kNan
                : r == 1 ? kInf
                : r == 2 ? -kInf
                : r == 3 ? -0.0f
                : r == 4 ? 0.0f
                         : static_cast<float>(real(rng));
            break;
          case Fill::kSmallInts:
            v = static_cast<float>(small(rng));
            break;
          case Fill::kUnit:
            v = static_cast<float>(unit(rng));
            break;
          case Fill::kTies:
            v = r < 2 ? kNan : r < 4 ? -kInf : r < 6 ? -0.0f : static_cast<float>(small(rng) / 2);
            break;
        }
        p[i] = T(v);
      } else if constexpr (std::is_floating_point_v<T>) {
        const int r = pick(rng);
        constexpr T kInf = std::numeric_limits<T>::infinity();
        constexpr T kNan = std::numeric_limits<T>::quiet_NaN();
        switch (fill) {
          case Fill::kMixed:
            p[i] = r == 0   ? kNan
                   : r == 1 ? kInf
                   : r == 2 ? -kInf
                   : r == 3 ? T(-0.0)
                   : r == 4 ? T(0)
                            : static_cast<T>(real(rng));
            break;
          case Fill::kSmallInts:
            p[i] = static_cast<T>(small(rng));
            break;
          case Fill::kUnit:
            p[i] = static_cast<T>(unit(rng));
            break;
          case Fill::kTies:
            p[i] = r < 2 ? kNan : r < 4 ? -kInf : r < 6 ? T(-0.0) : static_cast<T>(small(rng) / 2);
            break;
        }
      } else {
        if (fill == Fill::kMixed && (rng() & 1) != 0) {
          p[i] = static_cast<T>(rng());
        } else {
          p[i] = static_cast<T>(fill == Fill::kTies ? small(rng) / 2 : small(rng));
        }
      }
    }
  });
  return h;
}

// Bits of a float as an integer that orders like the float (for ulp distances).
template <class T>
int64_t ordered(T v) {
  if constexpr (sizeof(T) == 2) {
    int16_t b;
    std::memcpy(&b, &v, 2);
    return b < 0 ? int64_t{INT16_MIN} - b : b;
  } else if constexpr (sizeof(T) == 4) {
    int32_t b;
    std::memcpy(&b, &v, 4);
    return b < 0 ? int64_t{INT32_MIN} - b : b;
  } else {
    int64_t b;
    std::memcpy(&b, &v, 8);
    return b < 0 ? INT64_MIN - b : b;
  }
}

// Index of the first element where got differs from want beyond `ulps` (floats; NaN matches
// NaN), or -1.
int64_t first_mismatch(const Host& want, const Host& got, int ulps, std::string& what) {
  int64_t bad = -1;
  visit(want.t, [&](auto tv) {
    using T = decltype(tv);
    const T* w = want.as<T>();
    const T* g = got.as<T>();
    for (int64_t i = 0; i < want.n() && bad < 0; ++i) {
      if (std::memcmp(&w[i], &g[i], sizeof(T)) == 0) continue;
      if constexpr (kFloatLike<T>) {
        if (nan_of(w[i]) && nan_of(g[i])) continue;
        if (ulps > 0 && !nan_of(w[i]) && !nan_of(g[i]) &&
            std::isfinite(as_double(w[i])) == std::isfinite(as_double(g[i]))) {
          const __int128 d = static_cast<__int128>(ordered(w[i])) - ordered(g[i]);
          if (d <= ulps && d >= -ulps) continue;
        }
      }
      std::ostringstream os;
      os << "element " << i << ": cpu " << shown(w[i]) << ", cuda " << shown(g[i]);
      what = os.str();
      bad = i;
    }
  });
  return bad;
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (default_platform() != "cuda") GTEST_SKIP() << "runs in the cuda_k1 entries";
    cuda_ = &detail::backend_of(Device::Kind::cuda);
    if (cuda_->device_count() == 0) GTEST_SKIP() << cuda_->unavailable_reason();
    static Backend* cpu = backend::make_cpu_backend(1).release();  // leaked: executors
    cpu_ = cpu;
  }

  // A device copy of h, starting `pad` elements into its allocation (pad 1: off alignment).
  void* upload(const Host& h, int64_t pad = 0) {
    const size_t e = dtype_size(h.t);
    auto buf = cuda_->allocate(0, h.bytes.size() + (pad + 2) * e);
    held_.push_back(buf);
    char* p = static_cast<char*>(buf->data()) + pad * e;
    if (!h.bytes.empty()) {
      cuda_->copy_2d(p, 0, h.bytes.size(), h.bytes.data(), backend::kHost, h.bytes.size(),
                     h.bytes.size(), 1);
    }
    return p;
  }
  void* device_out(DType t, int64_t n, int64_t pad = 0) {
    Host zero = make(t, n);
    std::memset(zero.bytes.data(), 0x5a, zero.bytes.size());  // no kernel leaves it as it was
    return upload(zero, pad);
  }
  Host download(const void* p, DType t, int64_t n) {
    cuda_->synchronize(0);
    Host h = make(t, n);
    if (n > 0) {
      cuda_->copy_2d(h.bytes.data(), backend::kHost, h.bytes.size(), p, 0, h.bytes.size(),
                     h.bytes.size(), 1);
    }
    return h;
  }
  void release() { held_.clear(); }

  Backend* cuda_ = nullptr;
  Backend* cpu_ = nullptr;
  std::vector<std::shared_ptr<backend::Buffer>> held_;
  std::mt19937_64 rng_{20240611};
};

// An operand layout: the output shape and each operand's strides (unary uses s[0], binary s[0]
// and s[1], select s[0] for the condition and s[1], s[2]); pad 1 moves every pointer, the
// output's too, one element off its allocation's alignment.
struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> s[3];
  int64_t pad = 0;
};

// Elements an operand with `strides` over `shape` spans.
int64_t span(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t last = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return 0;
    last += (shape[d] - 1) * strides[d];
  }
  return last + 1;
}
int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<Layout> layouts() {
  std::vector<Layout> out;
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1023}, int64_t{4097}, (int64_t{1} << 20) + 5})
    out.push_back({"dense " + std::to_string(n), {n}, {{1}, {1}, {1}}});
  out.push_back({"rank 0", {}, {{}, {}, {}}});
  out.push_back({"scalar b", {4097}, {{1}, {0}, {1}}});
  out.push_back({"scalar a", {4096}, {{0}, {1}, {0}}});
  for (auto [r, c] : {std::pair<int64_t, int64_t>{64, 1024}, {5, 1023}, {9, 3}, {3, 2}}) {
    const std::string rc = " " + std::to_string(r) + "x" + std::to_string(c);
    out.push_back({"row broadcast" + rc, {r, c}, {{c, 1}, {0, 1}, {c, 1}}});
    out.push_back({"column broadcast" + rc, {r, c}, {{c, 1}, {1, 0}, {0, 1}}});
    out.push_back({"transposed" + rc, {r, c}, {{1, r}, {c, 1}, {1, 0}}});
  }
  out.push_back({"rank 3, middle broadcast", {6, 5, 7}, {{35, 7, 1}, {7, 0, 1}, {1, 6, 30}}});
  out.push_back({"rank 4 strided", {3, 4, 5, 6}, {{1, 3, 12, 60}, {120, 30, 6, 1}, {0, 5, 1, 0}}});
  out.push_back({"stride 2", {1001}, {{2}, {1}, {3}}});
  out.push_back({"misaligned dense 4097", {4097}, {{1}, {1}, {1}}, 1});
  out.push_back({"misaligned dense 1<<20", {int64_t{1} << 20}, {{1}, {1}, {1}}, 1});
  out.push_back({"misaligned row broadcast", {64, 1024}, {{1024, 1}, {0, 1}, {1024, 1}}, 1});
  out.push_back({"misaligned scalar", {1027}, {{1}, {0}, {1}}, 1});
  return out;
}

// Two math libraries (CUDA's, glibc's): on an H200, exp differed from cpu by at most 2 ulp, log,
// sin, cos by 1, tanh by 3 (each library's tanh is within 2 ulp of the truth), so tanh gets 4.
// bf16/f16: the float32 results above rounded to 16 bits, so at most 1 ulp of the 16-bit type.
int ulps(UnaryOp op, DType t = DType::f32) {
  const bool transcendental = op == UnaryOp::exp || op == UnaryOp::log || op == UnaryOp::sin ||
                              op == UnaryOp::cos || op == UnaryOp::tanh;
  if (is_half(t)) return transcendental ? 1 : 0;
  if (op == UnaryOp::tanh) return 4;
  return op == UnaryOp::exp || op == UnaryOp::log || op == UnaryOp::sin || op == UnaryOp::cos ? 2
                                                                                              : 0;
}

TEST_F(CudaKernels, UnaryAndAstypeMatchCpu) {
  for (const Layout& l : layouts()) {
    const int64_t n = count(l.shape);
    for (DType in : kDTypes) {
      const Host x = random(in, span(l.shape, l.s[0]), rng_, Fill::kMixed);
      void* dx = upload(x, l.pad);
      for (DType out : kDTypes) {
        for (int op = 0; op <= static_cast<int>(UnaryOp::relu); ++op) {
          if (op != 0 && in != out) continue;
          const auto u = static_cast<UnaryOp>(op);
          Host want = make(out, n);
          cpu_->unary(0, u, in, out, l.shape, Strided{x.bytes.data(), l.s[0]}, want.bytes.data());
          void* dy = device_out(out, n, l.pad);
          cuda_->unary(0, u, in, out, l.shape, Strided{dx, l.s[0]}, dy);
          std::string what;
          const int64_t bad = first_mismatch(want, download(dy, out, n), ulps(u, out), what);
          EXPECT_EQ(bad, -1) << l.name << ", unary op " << op << " " << dtype_name(in) << " -> "
                             << dtype_name(out) << ": " << what;
        }
      }
    }
    release();
  }
}

TEST_F(CudaKernels, BinaryMatchesCpu) {
  for (const Layout& l : layouts()) {
    const int64_t n = count(l.shape);
    for (DType t : kDTypes) {
      const Host a = random(t, span(l.shape, l.s[0]), rng_, Fill::kMixed);
      const Host b = random(t, span(l.shape, l.s[1]), rng_, Fill::kMixed);
      void* da = upload(a, l.pad);
      void* db = upload(b, l.pad);
      for (int op = 0; op <= static_cast<int>(BinaryOp::ge); ++op) {
        const auto bo = static_cast<BinaryOp>(op);
        if (bo == BinaryOp::div && !is_floating(t)) continue;  // the runtime divides as floats
        const DType out = op >= static_cast<int>(BinaryOp::eq) ? DType::bool_ : t;
        Host want = make(out, n);
        cpu_->binary(0, bo, t, out, l.shape, Strided{a.bytes.data(), l.s[0]},
                     Strided{b.bytes.data(), l.s[1]}, want.bytes.data());
        void* dy = device_out(out, n, l.pad);
        cuda_->binary(0, bo, t, out, l.shape, Strided{da, l.s[0]}, Strided{db, l.s[1]}, dy);
        std::string what;
        EXPECT_EQ(first_mismatch(want, download(dy, out, n), 0, what), -1)
            << l.name << ", binary op " << op << " " << dtype_name(t) << ": " << what;
      }
    }
    release();
  }
}

// jit's fused pairs (Backend::binary_unary, compare_select) equal the cpu's two kernels bit for
// bit, on every layout (past two merged dimensions the cuda backend takes the unfused default).
TEST_F(CudaKernels, FusedPairsMatchCpu) {
  for (const Layout& l : layouts()) {
    const int64_t n = count(l.shape);
    for (DType t : {DType::f32, DType::f64}) {
      const Host a = random(t, span(l.shape, l.s[0]), rng_, Fill::kMixed);
      const Host b = random(t, span(l.shape, l.s[1]), rng_, Fill::kMixed);
      const Host c = random(t, span(l.shape, l.s[2]), rng_, Fill::kMixed);
      void* da = upload(a, l.pad);
      void* db = upload(b, l.pad);
      void* dc = upload(c, l.pad);
      for (BinaryOp bo : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::max,
                          BinaryOp::min}) {
        for (UnaryOp uo : {UnaryOp::relu, UnaryOp::neg}) {
          Host want = make(t, n);
          cpu_->binary_unary(0, bo, uo, t, l.shape, Strided{a.bytes.data(), l.s[0]},
                             Strided{b.bytes.data(), l.s[1]}, want.bytes.data());
          void* dy = device_out(t, n, l.pad);
          cuda_->binary_unary(0, bo, uo, t, l.shape, Strided{da, l.s[0]}, Strided{db, l.s[1]}, dy);
          std::string what;
          EXPECT_EQ(first_mismatch(want, download(dy, t, n), 0, what), -1)
              << l.name << ", binary_unary " << static_cast<int>(bo) << "/" << static_cast<int>(uo)
              << " " << dtype_name(t) << ": " << what;
        }
      }
      for (BinaryOp cmp : {BinaryOp::gt, BinaryOp::le, BinaryOp::eq}) {
        Host want = make(t, n);
        // x0 = a, x1 = b, then the values c and a (the select reads the comparison's operand).
        cpu_->compare_select(0, cmp, t, t, l.shape, Strided{a.bytes.data(), l.s[0]},
                             Strided{b.bytes.data(), l.s[1]}, Strided{c.bytes.data(), l.s[2]},
                             Strided{a.bytes.data(), l.s[0]}, want.bytes.data());
        void* dy = device_out(t, n, l.pad);
        cuda_->compare_select(0, cmp, t, t, l.shape, Strided{da, l.s[0]}, Strided{db, l.s[1]},
                              Strided{dc, l.s[2]}, Strided{da, l.s[0]}, dy);
        std::string what;
        EXPECT_EQ(first_mismatch(want, download(dy, t, n), 0, what), -1)
            << l.name << ", compare_select " << static_cast<int>(cmp) << " " << dtype_name(t)
            << ": " << what;
      }
    }
    release();
  }
}

TEST_F(CudaKernels, SelectMatchesCpu) {
  for (const Layout& l : layouts()) {
    const int64_t n = count(l.shape);
    // Condition bytes 0, 1 and 2 (any nonzero byte picks a).
    Host c = make(DType::bool_, span(l.shape, l.s[0]));
    for (unsigned char& v : c.bytes) v = static_cast<unsigned char>(rng_() % 3);
    void* dc = upload(c, l.pad);
    for (DType t : kDTypes) {
      const Host a = random(t, span(l.shape, l.s[1]), rng_, Fill::kMixed);
      const Host b = random(t, span(l.shape, l.s[2]), rng_, Fill::kMixed);
      Host want = make(t, n);
      cpu_->select(0, t, l.shape, Strided{c.bytes.data(), l.s[0]}, Strided{a.bytes.data(), l.s[1]},
                   Strided{b.bytes.data(), l.s[2]}, want.bytes.data());
      void* dy = device_out(t, n, l.pad);
      cuda_->select(0, t, l.shape, Strided{dc, l.s[0]}, Strided{upload(a, l.pad), l.s[1]},
                    Strided{upload(b, l.pad), l.s[2]}, dy);
      std::string what;
      EXPECT_EQ(first_mismatch(want, download(dy, t, n), 0, what), -1)
          << l.name << ", select " << dtype_name(t) << ": " << what;
    }
    release();
  }
}

struct ReduceShape {
  int64_t outer, len, inner;
};
const ReduceShape kReduceShapes[] = {
    {1, 1, 1},     {3, 1, 5},          {1, 7, 1},     {7, 3, 1},      {5, 1000, 1},
    {2, 1025, 1},  {3, 5000, 1},       {1000, 33, 1}, {4, 100000, 1}, {1, (1 << 20) + 3, 1},
    {16, 2, 3},    {3, 17, 33},        {2, 4097, 7},  {1, 300, 64},   {1, 8192, 1024},
    {4, 513, 100}, {1, (1 << 16), 31}, {2, 0, 3},     {1, 1 << 20, 2}};

std::string shape_name(const ReduceShape& s) {
  return "(" + std::to_string(s.outer) + ", " + std::to_string(s.len) + ", " +
         std::to_string(s.inner) + ")";
}

TEST_F(CudaKernels, ReductionsMatchCpu) {
  for (const ReduceShape& s : kReduceShapes) {
    const int64_t n = s.outer * s.len * s.inner, rows = s.outer * s.inner;
    for (DType t : kNumeric) {
      for (int op = 0; op <= static_cast<int>(ReduceOp::argmax); ++op) {
        const auto ro = static_cast<ReduceOp>(op);
        if (ro == ReduceOp::argmax && s.len == 0) continue;  // no answer (cpu reads past the end)
        // Sums: integer-valued (exact in any order, so bit-equal; integers over their whole
        // range: wrapping); max/min/argmax: ties, NaN and infinities.
        const Fill fill = ro != ReduceOp::sum ? Fill::kTies
                          : is_floating(t)    ? Fill::kSmallInts
                                              : Fill::kMixed;
        const Host x = random(t, n, rng_, fill);
        const DType out = ro == ReduceOp::argmax ? DType::i64 : t;
        Host want = make(out, rows);
        cpu_->reduce(0, ro, t, s.outer, s.len, s.inner, x.bytes.data(), want.bytes.data());
        void* dx = upload(x);
        void* dy = device_out(out, rows);
        cuda_->reduce(0, ro, t, s.outer, s.len, s.inner, dx, dy);
        const Host got = download(dy, out, rows);
        std::string what;
        int64_t bad = -1;
        if ((ro == ReduceOp::max || ro == ReduceOp::min) && is_floating(t)) {
          visit(t, [&](auto tv) {
            using T = decltype(tv);
            for (int64_t i = 0; i < rows && bad < 0; ++i) {
              const T w = want.as<T>()[i], g = got.as<T>()[i];
              if (!(w == g || (nan_of(w) && nan_of(g)))) {
                bad = i;
                what = "cpu " + std::to_string(as_double(w)) + ", cuda " +
                       std::to_string(as_double(g));
              }
            }
          });
        } else {
          bad = first_mismatch(want, got, 0, what);
        }
        EXPECT_EQ(bad, -1) << shape_name(s) << " " << dtype_name(t) << " reduce op " << op
                           << ", output " << bad << ": " << what;
      }
      release();
    }
  }
}

TEST_F(CudaKernels, FloatSumsWithinToleranceAndDeterministic) {
  for (const ReduceShape& s : kReduceShapes) {
    const int64_t n = s.outer * s.len * s.inner, rows = s.outer * s.inner;
    for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      const Host x = random(t, n, rng_, Fill::kUnit);
      Host want = make(t, rows);
      cpu_->reduce(0, ReduceOp::sum, t, s.outer, s.len, s.inner, x.bytes.data(), want.bytes.data());
      void* dx = upload(x);
      void* d1 = device_out(t, rows);
      void* d2 = device_out(t, rows);
      cuda_->reduce(0, ReduceOp::sum, t, s.outer, s.len, s.inner, dx, d1);
      cuda_->reduce(0, ReduceOp::sum, t, s.outer, s.len, s.inner, dx, d2);
      const Host g1 = download(d1, t, rows), g2 = download(d2, t, rows);
      EXPECT_EQ(g1.bytes, g2.bytes) << shape_name(s) << ": two runs gave different bits";
      visit(t, [&](auto tv) {
        using T = decltype(tv);
        if constexpr (kFloatLike<T>) {
          // 16-bit sums accumulate in float32: its reordering bound, plus one rounding apart.
          const double rel = sizeof(T) == 8 ? 1e-13 : 1e-5;
          int failures = 0;
          for (int64_t r = 0; r < rows && failures < 3; ++r) {
            const int64_t o = r / s.inner, i = r % s.inner;
            double abs_sum = 0;
            for (int64_t l = 0; l < s.len; ++l)
              abs_sum += std::abs(as_double(x.as<T>()[(o * s.len + l) * s.inner + i]));
            const double w = as_double(want.as<T>()[r]), g = as_double(g1.as<T>()[r]);
            double tol = rel * abs_sum;
            if constexpr (is_half_v<T>) tol += half_ulp_at<T>(std::max(std::abs(w), std::abs(g)));
            if (!(std::abs(w - g) <= tol)) {
              ++failures;
              ADD_FAILURE() << shape_name(s) << " " << dtype_name(t) << " sum, output " << r
                            << ": cpu " << w << ", cuda " << g << ", tolerance " << tol;
            }
          }
        }
      });
      release();
    }
  }
}

// coll_fold_to: one fold written to several outputs (a direct psum between logical devices),
// against the cpu backend's coll_fold of the same sources, in every output: bit-equal (the same
// left-to-right order; NaN matches NaN). Up to kMaxFoldTo (16) sources and outputs in one kernel,
// more through the fold-then-copy default; 16-byte vectors when every pointer is aligned, else
// elements; an output that is also a source.
TEST_F(CudaKernels, FoldToWritesTheCpuFoldToEveryOutput) {
  using backend::FoldOp;
  for (int64_t len :
       {int64_t{1}, int64_t{3}, int64_t{1023}, int64_t{4097}, (int64_t{1} << 20) + 5}) {
    for (int nsrc : {1, 2, 3, 8, 16, 17}) {
      if (len > 5000 && nsrc != 3 && nsrc != 16) continue;  // long rows: two source counts
      for (int64_t pad : {int64_t{0}, int64_t{1}}) {
        for (DType t : kNumeric) {
          for (FoldOp op : {FoldOp::sum, FoldOp::max, FoldOp::min, FoldOp::mean}) {
            if (op == FoldOp::mean && !is_half(t)) continue;  // 16-bit pmean folds in one pass
            const Fill fill = op == FoldOp::sum ? Fill::kMixed : Fill::kTies;
            std::vector<Host> in;
            std::vector<const void*> host_srcs, dev_srcs;
            for (int j = 0; j < nsrc; ++j) {
              in.push_back(random(t, len, rng_, fill));
              dev_srcs.push_back(upload(in.back(), j == nsrc - 1 ? pad : 0));
            }
            for (const Host& h : in) host_srcs.push_back(h.bytes.data());
            Host want = make(t, len);
            cpu_->coll_fold(0, op, t, t, want.bytes.data(), host_srcs, len);
            const int ndst = nsrc == 17 ? 17 : std::min(nsrc + 1, 16);
            std::vector<void*> dsts;
            for (int k = 0; k < ndst; ++k) dsts.push_back(device_out(t, len, k == 1 ? pad : 0));
            // The last output is the first source (a member's psum written over its input).
            dsts.back() = const_cast<void*>(dev_srcs[0]);
            cuda_->coll_fold_to(0, op, t, t, dsts, dev_srcs, len);
            cuda_->coll_fence(0);
            for (int k = 0; k < ndst; ++k) {
              const Host got = download(dsts[static_cast<size_t>(k)], t, len);
              std::string what;
              EXPECT_EQ(first_mismatch(want, got, 0, what), -1)
                  << "fold_to op " << static_cast<int>(op) << " " << dtype_name(t) << ", " << nsrc
                  << " sources, len " << len << ", pad " << pad << ", output " << k << ": " << what;
            }
            release();
          }
        }
      }
    }
  }
}

// Host bytes of the values of `v` as elements of T.
template <class T>
Host host_of(DType t, const std::vector<T>& v) {
  Host h = make(t, static_cast<int64_t>(v.size()));
  if (!v.empty()) std::memcpy(h.bytes.data(), v.data(), h.bytes.size());
  return h;
}

// astype to and from bf16/f16 at the corners: round-to-nearest-even ties, float16 overflow to
// Inf (65519 stays finite, 65520 does not), subnormals of both types and of float32, NaN with a
// payload and either sign, +-Inf, +-0, doubles and integers rounded through float32 first (so a
// double just above a bfloat16 tie rounds twice, as JAX). Every conversion equals the cpu
// kernel's bits; a few are also checked against bits worked out by hand.
TEST_F(CudaKernels, HalfConversionCornerCases) {
  const float f32_in[] = {0.0f,
                          -0.0f,
                          1.0f,
                          1.00390625f,     // 1 + 2^-8: a bfloat16 tie, to even (1)
                          1.01171875f,     // 1 + 3 * 2^-8: a tie, to even (up)
                          1.00048828125f,  // 1 + 2^-11: a float16 tie, to even (1)
                          65504.0f,
                          65519.0f,  // float16: rounds down to 65504
                          65520.0f,  // float16: a tie at the top, rounds to Inf
                          1e5f,
                          -1e5f,
                          3.0e38f,
                          0x1p-24f,    // float16's smallest subnormal
                          0x1p-25f,    // a tie between 0 and it: to even (0)
                          0x1.8p-24f,  // 1.5 subnormal units: a tie, to even (2 units)
                          0x1p-14f,    // float16's smallest normal
                          0x1p-130f,   // a float32 subnormal (a bfloat16 subnormal too)
                          1e-45f,      // float32's smallest subnormal
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          0.1f,
                          -2.5f};
  std::vector<float> f32(std::begin(f32_in), std::end(f32_in));
  uint32_t payload = 0x7fa12345u;  // a signalling NaN with a payload
  float nan_payload;
  std::memcpy(&nan_payload, &payload, 4);
  f32.push_back(nan_payload);
  const std::vector<double> f64 = {
      1.0 + 0x1p-8 + 0x1p-40,  // float32 rounds it to the tie
      1.0 + 0x1p-11 + 0x1p-40, 65519.99, 1e300, -1e300, 0x1p-1000, std::nan(""), 1e-8};
  const std::vector<int32_t> i32 = {0,     1,     -1,    255,      257,       2049,
                                    65504, 65520, 70000, 16777217, INT32_MIN, INT32_MAX};
  const std::vector<int64_t> i64 = {16777217, (int64_t{1} << 40) + 1, INT64_MIN, INT64_MAX,
                                    -12345678901};
  const std::vector<Host> sources = {host_of(DType::f32, f32), host_of(DType::f64, f64),
                                     host_of(DType::i32, i32), host_of(DType::i64, i64)};
  for (const Host& x : sources) {
    void* dx = upload(x);
    for (DType out : kHalves) {
      const std::vector<int64_t> shape = {x.n()};
      Host want = make(out, x.n());
      cpu_->unary(0, UnaryOp::copy, x.t, out, shape, Strided{x.bytes.data(), {1}},
                  want.bytes.data());
      void* dy = device_out(out, x.n());
      cuda_->unary(0, UnaryOp::copy, x.t, out, shape, Strided{dx, {1}}, dy);
      const Host got = download(dy, out, x.n());
      EXPECT_EQ(want.bytes, got.bytes) << dtype_name(x.t) << " -> " << dtype_name(out);
      if (x.t == DType::f32) {
        const uint16_t* g = got.as<uint16_t>();
        if (out == DType::bf16) {
          EXPECT_EQ(g[3], 0x3f80) << "bf16 tie to even, down";
          EXPECT_EQ(g[4], 0x3f82) << "bf16 tie to even, up";
          EXPECT_EQ(g[16], 0x0008) << "2^-130: a bfloat16 subnormal";
          EXPECT_EQ(g[20], 0x7fc0) << "NaN: the canonical quiet NaN";
          EXPECT_EQ(g[21], 0xffc0) << "-NaN keeps its sign";
        } else {
          EXPECT_EQ(g[5], 0x3c00) << "f16 tie to even";
          EXPECT_EQ(g[7], 0x7bff) << "65519 -> 65504";
          EXPECT_EQ(g[8], 0x7c00) << "65520 -> Inf";
          EXPECT_EQ(g[9], 0x7c00) << "1e5 -> Inf";
          EXPECT_EQ(g[10], 0xfc00) << "-1e5 -> -Inf";
          EXPECT_EQ(g[12], 0x0001) << "2^-24";
          EXPECT_EQ(g[13], 0x0000) << "2^-25: a tie to zero";
          EXPECT_EQ(g[14], 0x0002) << "1.5 * 2^-24: a tie to 2 units";
          EXPECT_EQ(g[1], 0x8000) << "-0";
        }
      }
      if (x.t == DType::f64 && out == DType::bf16) {
        EXPECT_EQ(got.as<uint16_t>()[0], 0x3f80) << "through float32 first: rounds twice";
      }
      // And back: every dtype from these 16-bit values (NaN to integers gives 0, Inf saturates,
      // bfloat16 subnormals to float64 flush to zero, as the cpu).
      void* dh = dy;
      for (DType back : kDTypes) {
        Host want_back = make(back, x.n());
        cpu_->unary(0, UnaryOp::copy, out, back, shape, Strided{got.bytes.data(), {1}},
                    want_back.bytes.data());
        void* db = device_out(back, x.n());
        cuda_->unary(0, UnaryOp::copy, out, back, shape, Strided{dh, {1}}, db);
        EXPECT_EQ(want_back.bytes, download(db, back, x.n()).bytes)
            << dtype_name(out) << " -> " << dtype_name(back) << " (from " << dtype_name(x.t) << ")";
      }
    }
  }
}

// fill and iota of the 16-bit types: the value (a double) and each index rounded through float32
// as the cpu kernel.
TEST_F(CudaKernels, HalfFillAndIotaMatchCpu) {
  for (DType t : kHalves) {
    for (double value : {0.1, -3.0, 65519.99, 1e10, -0.0}) {
      for (bool iota : {false, true}) {
        const int64_t n = 70001;
        Host want = make(t, n);
        cpu_->fill(0, t, n, value, iota, want.bytes.data());
        void* dy = device_out(t, n);
        cuda_->fill(0, t, n, value, iota, dy);
        EXPECT_EQ(want.bytes, download(dy, t, n).bytes)
            << dtype_name(t) << (iota ? " iota" : " fill ") << value;
      }
    }
  }
}

// 16-bit folds over more sources than one kernel launch takes (kMaxFoldSources, 256) and over
// pitched rows (coll_fold_rows): still one float32 accumulation per output and one rounding, so
// the cpu's bits. Values 1 and 256: a 16-bit running sum would stick at 256 and drift from the
// float32 sum; so would a rounding at each launch's end. A 16-bit pmean's coll_mean divides a
// 16-bit sum in float32 and rounds once. float32 and int32 take the same launches (the fold so
// far carried in dst).
TEST_F(CudaKernels, HalfFoldsRoundOncePerOutput) {
  using backend::FoldOp;
  const int64_t len = 37;
  for (DType t : {DType::bf16, DType::f16, DType::f32, DType::i32}) {
    for (int nsrc : {3, 17, 300, 600}) {
      for (FoldOp op : {FoldOp::sum, FoldOp::mean, FoldOp::max, FoldOp::min}) {
        if (op == FoldOp::mean && !is_half(t)) continue;
        std::vector<Host> in;
        std::vector<const void*> host_srcs, dev_srcs;
        for (int j = 0; j < nsrc; ++j) {
          Host h = random(t, len, rng_, Fill::kSmallInts);
          visit(t, [&](auto tv) {
            using T = decltype(tv);
            if constexpr (is_half_v<T>) {
              if (j == 0) h.as<T>()[0] = T(256.0f);
              if (j > 0) h.as<T>()[0] = T(1.0f);
            }
          });
          in.push_back(std::move(h));
          dev_srcs.push_back(upload(in.back()));
        }
        for (const Host& h : in) host_srcs.push_back(h.bytes.data());
        Host want = make(t, len);
        cpu_->coll_fold(0, op, t, t, want.bytes.data(), host_srcs, len);
        void* dy = device_out(t, len);
        cuda_->coll_fold(0, op, t, t, dy, dev_srcs, len);
        cuda_->coll_fence(0);
        std::string what;
        EXPECT_EQ(first_mismatch(want, download(dy, t, len), 0, what), -1)
            << "coll_fold op " << static_cast<int>(op) << " " << dtype_name(t) << ", " << nsrc
            << " sources: " << what;
        if (op == FoldOp::sum) {
          // Element 0: 256 + (nsrc - 1), exact in float32, rounded once.
          const float exact = 256.0f + static_cast<float>(nsrc - 1);
          visit(t, [&](auto tv) {
            using T = decltype(tv);
            if constexpr (is_half_v<T>) {
              EXPECT_EQ(static_cast<float>(want.as<T>()[0]), static_cast<float>(T(exact)))
                  << "the cpu reference itself";
            }
          });
        }
        if (op != FoldOp::mean) {
          // The same sources as 3 rows of 12 (pitch 12 in the sources, 13 in dst).
          const int64_t rows = 3, w = 12, spitch = 12, dpitch = 13;
          Host want_rows = make(t, rows * dpitch);
          std::memset(want_rows.bytes.data(), 0x5a, want_rows.bytes.size());
          cpu_->coll_fold_rows(0, op, t, want_rows.bytes.data(), dpitch, host_srcs, spitch, w,
                               rows);
          void* dr = upload(want_rows);  // the gaps between rows keep their bytes
          cuda_->coll_fold_rows(0, op, t, dr, dpitch, dev_srcs, spitch, w, rows);
          cuda_->coll_fence(0);
          EXPECT_EQ(first_mismatch(want_rows, download(dr, t, rows * dpitch), 0, what), -1)
              << "coll_fold_rows op " << static_cast<int>(op) << " " << dtype_name(t) << ", "
              << nsrc << " sources: " << what;
        }
        release();
      }
    }
    // coll_mean: a 16-bit sum divided by the member count.
    if (!is_half(t)) continue;
    const Host sum = random(t, 4097, rng_, Fill::kMixed);
    Host want = make(t, sum.n());
    cpu_->coll_mean(0, t, t, want.bytes.data(), sum.bytes.data(), sum.n(), 3);
    void* dy = device_out(t, sum.n());
    cuda_->coll_mean(0, t, t, dy, upload(sum), sum.n(), 3);
    cuda_->coll_fence(0);
    std::string what;
    EXPECT_EQ(first_mismatch(want, download(dy, t, sum.n()), 0, what), -1)
        << "coll_mean " << dtype_name(t) << ": " << what;
    release();
  }
}

TEST_F(CudaKernels, MatmulTransposesMatchCpu) {
  struct Case {
    int64_t batch, m, n, k;
  };
  const Case cases[] = {
      {1, 1, 1, 1}, {1, 5, 7, 3}, {3, 64, 33, 17}, {2, 128, 96, 200}, {1, 4, 5, 0}};
  for (const Case& c : cases) {
    for (DType t : kNumeric) {
      for (bool unit : {false, true}) {
        if (unit && !is_floating(t)) continue;
        const Host a = random(t, c.batch * c.m * c.k, rng_, unit ? Fill::kUnit : Fill::kSmallInts);
        const Host b = random(t, c.batch * c.k * c.n, rng_, unit ? Fill::kUnit : Fill::kSmallInts);
        void* da = upload(a);
        void* db = upload(b);
        for (int tr = 0; tr < 4; ++tr) {
          const bool ta = (tr & 1) != 0, tb = (tr & 2) != 0;
          const int64_t cn = c.batch * c.m * c.n;
          Host want = make(t, cn);
          cpu_->matmul_t(0, t, c.batch, c.m, c.n, c.k, a.bytes.data(), ta, b.bytes.data(), tb,
                         want.bytes.data());
          void* dc = device_out(t, cn);
          cuda_->matmul_t(0, t, c.batch, c.m, c.n, c.k, da, ta, db, tb, dc);
          const Host got = download(dc, t, cn);
          const std::string name = "matmul_t (" + std::to_string(c.batch) + ", " +
                                   std::to_string(c.m) + ", " + std::to_string(c.n) + ", " +
                                   std::to_string(c.k) + ") " + std::string(dtype_name(t)) +
                                   (ta ? " trans_a" : "") + (tb ? " trans_b" : "");
          if (!unit) {
            std::string what;
            EXPECT_EQ(first_mismatch(want, got, 0, what), -1) << name << ": " << what;
            continue;
          }
          visit(t, [&](auto tv) {
            using T = decltype(tv);
            if constexpr (kFloatLike<T>) {
              const double rel = sizeof(T) == 8 ? 1e-13 : 1e-5;
              const T* A = a.as<T>();
              const T* B = b.as<T>();
              int failures = 0;
              for (int64_t e = 0; e < cn && failures < 3; ++e) {
                const int64_t bt = e / (c.m * c.n), i = e / c.n % c.m, j = e % c.n;
                double bound = 0;
                for (int64_t q = 0; q < c.k; ++q) {
                  const T av =
                      ta ? A[bt * c.m * c.k + q * c.m + i] : A[bt * c.m * c.k + i * c.k + q];
                  const T bv =
                      tb ? B[bt * c.k * c.n + j * c.k + q] : B[bt * c.k * c.n + q * c.n + j];
                  bound += std::abs(as_double(av) * as_double(bv));
                }
                const double w = as_double(want.as<T>()[e]), g = as_double(got.as<T>()[e]);
                double tol = rel * bound;
                if constexpr (is_half_v<T>)
                  tol += half_ulp_at<T>(std::max(std::abs(w), std::abs(g)));
                if (!(std::abs(w - g) <= tol)) {
                  ++failures;
                  ADD_FAILURE() << name << ", element " << e << ": cpu " << w << ", cuda " << g;
                }
              }
            }
          });
        }
        release();
      }
    }
  }
}

// MESHRT_CUDA_MATMUL=lt (run-gpu.sh's lt pass; skips otherwise): a layer's product with its bias
// add and relu in cuBLASLt's epilogue (Backend::matmul_bias) gives the unfused calls' bits (the
// product through the same shape's plan, then the add, then relu; a NaN matches any NaN), runs
// fused where the bias is 16-byte aligned (fused_matmul_bias_calls counts it; relu may follow
// as its own kernel where cuBLASLt's relu drops NaN) and unfused where it is not, split-K or not,
// and is within the product's tolerance of the cpu (highest 1e-5, tf32 2 * 2^-10 of sum_k |a||b|).
// The bias holds NaN, +Inf and -Inf once each: relu keeps NaN and +Inf, zeroes -Inf, as JAX.
TEST_F(CudaKernels, LtEpiloguesGiveTheUnfusedBits) {
  if (!cuda_->fuses_matmul_bias()) {
    GTEST_SKIP() << "the cuda platform fuses epilogues only under MESHRT_CUDA_MATMUL=lt";
  }
  struct Case {
    int64_t m, n, k;
  };
  // (8, 16, 65536): few outputs, a long sum, so cuBLASLt splits k (split-K) if it ever does.
  const Case cases[] = {{1, 1, 1},      {5, 7, 3},        {64, 33, 17},
                        {128, 96, 200}, {256, 1024, 784}, {8, 16, 65536}};
  const DType t = DType::f32;
  for (const Case& c : cases) {
    const Host a = random(t, c.m * c.k, rng_, Fill::kUnit);
    const Host b = random(t, c.k * c.n, rng_, Fill::kUnit);
    Host bias = random(t, c.n, rng_, Fill::kUnit);
    if (c.n >= 3) {
      bias.as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      bias.as<float>()[1] = std::numeric_limits<float>::infinity();
      bias.as<float>()[2] = -std::numeric_limits<float>::infinity();
    }
    for (int64_t pad : {int64_t{0}, int64_t{1}}) {  // pad 1: every operand off 16-byte alignment
      void* da = upload(a, pad);
      void* db = upload(b, pad);
      void* dbias = upload(bias, pad);
      for (int tr = 0; tr < 4; ++tr) {
        const bool ta = (tr & 1) != 0, tb = (tr & 2) != 0;
        for (Precision prec : {Precision::highest, Precision::tf32}) {
          for (bool relu : {false, true}) {
            const std::string name = "(" + std::to_string(c.m) + ", " + std::to_string(c.n) + ", " +
                                     std::to_string(c.k) + ")" + (ta ? " trans_a" : "") +
                                     (tb ? " trans_b" : "") + " " +
                                     std::string(precision_name(prec)) + (relu ? " relu" : "") +
                                     (pad != 0 ? " misaligned" : "");
            const int64_t cn = c.m * c.n;
            void* unfused = device_out(t, cn, pad);
            cuda_->Backend::matmul_bias(0, t, c.m, c.n, c.k, da, ta, db, tb, prec, dbias, relu,
                                        unfused);
            void* fused = device_out(t, cn, pad);
            const int64_t before = cuda_->fused_matmul_bias_calls();
            cuda_->matmul_bias(0, t, c.m, c.n, c.k, da, ta, db, tb, prec, dbias, relu, fused);
            const int64_t ran = cuda_->fused_matmul_bias_calls() - before;
            if (pad == 0) {
              EXPECT_EQ(ran, 1) << name << ": an aligned layer did not run fused";
            } else {
              EXPECT_EQ(ran, 0) << name << ": a bias off 16-byte alignment ran fused";
            }
            const Host u = download(unfused, t, cn), f = download(fused, t, cn);
            std::string what;
            EXPECT_EQ(first_mismatch(u, f, 0, what), -1) << name << ": " << what;
            // Against the cpu (which stores a and b as ta/tb say: reinterpret the same data).
            Host want = make(t, cn);
            cpu_->matmul_bias(0, t, c.m, c.n, c.k, a.bytes.data(), ta, b.bytes.data(), tb, prec,
                              bias.bytes.data(), relu, want.bytes.data());
            const double rel = prec == Precision::tf32 ? 2.0 / 1024 : 1e-5;
            int failures = 0;
            for (int64_t e = 0; e < cn && failures < 3; ++e) {
              const int64_t i = e / c.n, j = e % c.n;
              double bound = std::abs(static_cast<double>(bias.as<float>()[j]));
              for (int64_t q = 0; q < c.k; ++q) {
                const float av = ta ? a.as<float>()[q * c.m + i] : a.as<float>()[i * c.k + q];
                const float bv = tb ? b.as<float>()[j * c.k + q] : b.as<float>()[q * c.n + j];
                bound += std::abs(static_cast<double>(av) * bv);
              }
              const double w = want.as<float>()[e], g = f.as<float>()[e];
              if (std::isnan(w) || std::isnan(g) || std::isinf(w) || std::isinf(g)) {
                if (!(std::isnan(w) && std::isnan(g)) && w != g) {
                  ++failures;
                  ADD_FAILURE() << name << ", element " << e << ": cpu " << w << ", cuda " << g;
                }
              } else if (!(std::abs(w - g) <= rel * bound)) {
                ++failures;
                ADD_FAILURE() << name << ", element " << e << ": cpu " << w << ", cuda " << g;
              }
            }
          }
        }
      }
      release();
    }
  }
}

// MESHRT_CUDA_MATMUL=lt (run-gpu.sh's lt pass; skips otherwise): relu's gradient after a product
// (matmul_drelu: cuBLASLt's DRELU epilogue fed a relu mask, where its probe per shape found the
// unfused bits) gives the unfused calls' bits, NaN and infinities among the products and in y,
// y positive, zero and negative, widths that are not a multiple of the mask's 32 or 128 bits,
// either operand transposed, both precisions, operands aligned or not. How many calls ran fused
// is printed: where none did, DRELU gave other bits on this GPU and relu's gradients run unfused.
TEST_F(CudaKernels, LtDreluGivesTheUnfusedBits) {
  if (!cuda_->fuses_matmul_drelu()) {
    GTEST_SKIP() << "the cuda platform fuses relu's gradient only under MESHRT_CUDA_MATMUL=lt";
  }
  struct Case {
    int64_t m, n, k;
  };
  // (1, 1, 1) and (5, 3, 1) are never probed (k < 2, too few outputs) and run unfused; (1, 37, 5)
  // is one row, whose special values vary along it only.
  const Case cases[] = {{1, 1, 1},    {5, 3, 1},      {1, 37, 5},      {5, 7, 3},
                        {64, 33, 17}, {128, 130, 64}, {256, 1024, 784}};
  const DType t = DType::f32;
  int64_t calls = 0;
  const int64_t fused_before = cuda_->fused_matmul_drelu_calls();
  for (const Case& c : cases) {
    Host a = random(t, c.m * c.k, rng_, Fill::kUnit);
    const Host b = random(t, c.k * c.n, rng_, Fill::kUnit);
    Host y = random(t, c.m * c.n, rng_, Fill::kUnit);
    for (int64_t e = 0; e < c.m * c.n; e += 5) y.as<float>()[e] = 0.0f;
    if (c.m * c.n >= 8) {
      y.as<float>()[3] = std::numeric_limits<float>::quiet_NaN();
      y.as<float>()[6] = -0.0f;
    }
    if (c.m * c.k >= 3) {
      a.as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      a.as<float>()[1] = std::numeric_limits<float>::infinity();
      a.as<float>()[2] = -std::numeric_limits<float>::infinity();
    }
    for (int64_t pad : {int64_t{0}, int64_t{1}}) {  // pad 1: every operand off 16-byte alignment
      void* da = upload(a, pad);
      void* db = upload(b, pad);
      void* dy = upload(y, pad);
      for (int tr = 0; tr < 4; ++tr) {
        const bool ta = (tr & 1) != 0, tb = (tr & 2) != 0;
        for (Precision prec : {Precision::highest, Precision::tf32}) {
          const std::string name =
              "(" + std::to_string(c.m) + ", " + std::to_string(c.n) + ", " + std::to_string(c.k) +
              ")" + (ta ? " trans_a" : "") + (tb ? " trans_b" : "") + " " +
              std::string(precision_name(prec)) + (pad != 0 ? " misaligned" : "");
          const int64_t cn = c.m * c.n;
          void* unfused = device_out(t, cn, pad);
          cuda_->Backend::matmul_drelu(0, t, c.m, c.n, c.k, da, ta, db, tb, prec, dy, unfused);
          void* fused = device_out(t, cn, pad);
          cuda_->matmul_drelu(0, t, c.m, c.n, c.k, da, ta, db, tb, prec, dy, fused);
          ++calls;
          const Host u = download(unfused, t, cn), f = download(fused, t, cn);
          std::string what;
          EXPECT_EQ(first_mismatch(u, f, 0, what), -1) << name << ": " << what;
        }
      }
      release();
    }
  }
  const int64_t fused = cuda_->fused_matmul_drelu_calls() - fused_before;
  std::cout << "[ drelu    ] " << fused << " of " << calls
            << " matmul_drelu calls ran as cuBLASLt's DRELU epilogue\n";
  RecordProperty("drelu_fused_calls", std::to_string(fused));
}

// MESHRT_CUDA_MATMUL=lt (run-gpu.sh's lt pass; skips otherwise): the global view's one-expression
// layer, relu(matmul(x, W) + b) in eager code, runs as one cuBLASLt call per device (counted by
// fused_matmul_bias_calls: a 16-byte aligned bias) with the bits of the ops one by one (a named
// product, then + b, then relu), at both precisions, over 2 logical devices where there are two.
TEST_F(CudaKernels, OneExpressionLayerRunsFusedWithTheOpByOpBits) {
  if (!cuda_->fuses_matmul_bias()) {
    GTEST_SKIP() << "the cuda platform fuses epilogues only under MESHRT_CUDA_MATMUL=lt";
  }
  std::vector<Device> ds = devices("cuda");
  ds.resize(std::min<size_t>(ds.size(), 2));
  Mesh mesh = make_mesh({static_cast<int64_t>(ds.size())}, {"x"}, ds);
  const NamedSharding rows(mesh, P("x")), rep(mesh, P());
  auto values = [](int64_t n, float start, float step_by) {
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = start + step_by * static_cast<float>(i % 89);
    return v;
  };
  const Array x = device_put(values(512 * 256, -0.4f, 0.01f), {512, 256}, rows);
  const Array w = device_put(values(256 * 384, 0.3f, -0.007f), {256, 384}, rep);
  const Array b = device_put(values(384, -0.2f, 0.005f), {384}, rep);
  for (Precision prec : {Precision::highest, Precision::tf32}) {
    const OpOptions o{.precision = prec};
    const Array product = matmul(x, w, o);
    const Array want = relu(product + b);
    const int64_t before = cuda_->fused_matmul_bias_calls();
    const Array got = relu(matmul(x, w, o) + b);
    const std::vector<float> g = got.to_vector<float>(), v = want.to_vector<float>();
    EXPECT_EQ(cuda_->fused_matmul_bias_calls() - before, static_cast<int64_t>(ds.size()))
        << precision_name(prec);
    ASSERT_EQ(g.size(), v.size());
    EXPECT_EQ(std::memcmp(g.data(), v.data(), g.size() * sizeof(float)), 0) << precision_name(prec);
  }
}

// MESHRT_CUDA_GRAPHS=1 (run-gpu.sh's graphs pass; skips otherwise): a jitted step with cuBLAS
// products, a two-pass reduction (stream-ordered scratch inside the graph), fused pairs and
// elementwise ops, its input donated so its addresses repeat, launches CUDA graphs from its
// third call on, and every call gives eager's bits; then from two threads at once (one may be
// capturing while the other launches kernels on the same device).
TEST_F(CudaKernels, JitStepsRunAsCudaGraphsWithEagerBits) {
  if (!config::cuda_graphs()) {
    GTEST_SKIP() << "the cuda platform captures jit's steps only under MESHRT_CUDA_GRAPHS=1";
  }
  const Device d = devices("cuda").front();
  Mesh mesh = make_mesh({1}, {"d"}, std::vector<Device>{d});
  const NamedSharding rep(mesh, P());
  auto f = [](const Array& w, const Array& x) {
    const Array h = relu(matmul(x, w) + sum(x, 0, true) * 0.001);  // (512, 256), column sums
    return w - 0.01 * matmul_transposed(x, h, true, false) + sin(w) * 1e-3;
  };
  auto step = jit(f, {.donate_argnums = {0}});
  auto values = [](int64_t n, float start, float step_by) {
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = start + step_by * static_cast<float>(i % 97);
    return v;
  };
  const Array x = device_put(values(4096 * 256, -0.5f, 0.01f), {4096, 256}, rep);
  auto bits_equal = [](const Array& a, const Array& b) {
    const std::vector<float> u = a.to_vector<float>(), v = b.to_vector<float>();
    return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
  };
  Array w = device_put(values(256 * 256, 0.1f, -0.002f), {256, 256}, rep);
  const int64_t launches = cuda_->graph_launches();
  for (int call = 0; call < 6; ++call) {
    const Array want = f(w, x);
    Array next = step(w, x);
    EXPECT_TRUE(bits_equal(next, want)) << "call " << call;
    w = next;
  }
  EXPECT_GT(cuda_->graph_launches(), launches) << "no jitted step ran as a CUDA graph";
  // Two threads, each with its own weights, calling the same step at once.
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      try {
        Array wt = device_put(values(256 * 256, 0.2f * static_cast<float>(t + 1), 0.001f),
                              {256, 256}, rep);
        for (int call = 0; call < 8; ++call) {
          const Array want = f(wt, x);
          Array next = step(wt, x);
          if (!bits_equal(next, want)) errors[t] = "call " + std::to_string(call) + ": bits";
          wt = next;
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// MESHRT_CUDA_FUSION=chains (run-gpu.sh's chains pass; skips otherwise): fused elementwise chains
// (Backend::elementwise_chain, chain_kernels.cu) give the bits of their ops run one after the
// other: against the cuda platform's own unfused calls (the default, through temporaries) bit
// for bit, NaN payloads included, and against the cpu's unfused calls as the single-op tests do
// (bit-equal, a NaN matching any NaN; a chain ending in a transcendental within its ulps). The
// chains mix what the kernel must keep apart: products followed by sums (an FMA would change the
// bits), scalar and row broadcasts, a transposed and a rank-3 input (the general kernel), astype
// through bfloat16, float16 division by a broadcast divisor (its reciprocal rule) and by an
// intermediate, int32 wraparound, bool intermediates, NaN/Inf inputs, an in-place output, pointers
// off alignment. fuses_chain() takes every such chain and refuses the ones past its limits.
TEST_F(CudaKernels, ChainsMatchCpu) {
  if (!config::cuda_fusion_chains()) {
    GTEST_SKIP() << "the cuda platform fuses elementwise chains only under "
                    "MESHRT_CUDA_FUSION=chains";
  }
  using backend::ChainOp;
  using backend::ElementwiseChain;
  using Kind = ChainOp::Kind;
  auto un = [](UnaryOp op, DType in, DType out, int a) {
    ChainOp o;
    o.kind = Kind::unary;
    o.op = static_cast<int>(op);
    o.in = in;
    o.out = out;
    o.src[0] = a;
    return o;
  };
  auto bin = [](BinaryOp op, DType t, int a, int b) {
    ChainOp o;
    o.kind = Kind::binary;
    o.op = static_cast<int>(op);
    o.in = t;
    o.out = backend::is_comparison(op) ? DType::bool_ : t;
    o.src[0] = a;
    o.src[1] = b;
    return o;
  };
  auto sel = [](DType t, int c, int a, int b) {
    ChainOp o;
    o.kind = Kind::select;
    o.in = o.out = t;
    o.src[0] = c;
    o.src[1] = a;
    o.src[2] = b;
    return o;
  };
  struct In {
    DType t;
    std::vector<int64_t> strides;
    Fill fill = Fill::kMixed;
  };
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<In> in;
    std::vector<ChainOp> ops;
    int ulps = 0;           // against the cpu
    int64_t pad = 0;        // 1: every pointer off 16-byte alignment
    bool in_place = false;  // y is input 0's memory (dense)
  };
  const DType f32 = DType::f32, f64 = DType::f64, i32 = DType::i32, b8 = DType::bool_;
  const std::vector<int64_t> dense2 = {1000, 1}, scalar2 = {0, 0};
  std::vector<Case> cases;
  // Adam-like: m' = m*b1 + g*lr, v' = v*b2 + g*g, p - lr * m' / (sqrt(v') + eps).
  cases.push_back(
      {"adam f32",
       {64, 1000},
       {{f32, dense2, Fill::kUnit},
        {f32, dense2, Fill::kUnit},
        {f32, dense2, Fill::kUnit},
        {f32, dense2, Fill::kUnit},
        {f32, scalar2, Fill::kUnit},
        {f32, scalar2, Fill::kUnit},
        {f32, scalar2, Fill::kUnit},
        {f32, scalar2, Fill::kUnit}},
       {bin(BinaryOp::mul, f32, 2, 4), bin(BinaryOp::mul, f32, 1, 6), bin(BinaryOp::add, f32, 8, 9),
        bin(BinaryOp::mul, f32, 1, 1), bin(BinaryOp::mul, f32, 3, 5),
        bin(BinaryOp::add, f32, 12, 11), un(UnaryOp::sqrt, f32, f32, 13),
        bin(BinaryOp::add, f32, 14, 7), bin(BinaryOp::div, f32, 10, 15),
        bin(BinaryOp::mul, f32, 16, 6), bin(BinaryOp::sub, f32, 0, 17)}});
  cases.push_back(cases.back());
  cases.back().name = "adam f32 in place";
  cases.back().in_place = true;
  cases.push_back(cases.front());
  cases.back().name = "adam f32 misaligned";
  cases.back().pad = 1;
  // gelu's inner part, tanh last: tanh(c1 * (x + c0 * x * x * x)).
  cases.push_back({"gelu inner tanh",
                   {4097},
                   {{f32, {1}}, {f32, {0}, Fill::kUnit}, {f32, {0}, Fill::kUnit}},
                   {bin(BinaryOp::mul, f32, 0, 0), bin(BinaryOp::mul, f32, 3, 0),
                    bin(BinaryOp::mul, f32, 1, 4), bin(BinaryOp::add, f32, 0, 5),
                    bin(BinaryOp::mul, f32, 2, 6), un(UnaryOp::tanh, f32, f32, 7)},
                   ulps(UnaryOp::tanh)});
  // Comparisons and select with bool intermediates: where((x < y) * (y >= 0), x * s, y), then
  // plus the mask as float32.
  cases.push_back(
      {"compare select bools",
       {37, 129},
       {{f32, {129, 1}}, {f32, {129, 1}}, {f32, {0, 0}}, {b8, {129, 1}}},
       {bin(BinaryOp::lt, f32, 0, 1), bin(BinaryOp::ge, f32, 1, 2), bin(BinaryOp::mul, b8, 4, 5),
        bin(BinaryOp::add, b8, 6, 3), bin(BinaryOp::mul, f32, 0, 2), sel(f32, 7, 8, 1),
        un(UnaryOp::copy, b8, f32, 7), bin(BinaryOp::add, f32, 9, 10)}});
  // astype through bfloat16: f32(bf16(x) * y16) + x.
  cases.push_back({"astype f32 bf16 f32",
                   {3, 1023},
                   {{f32, {1023, 1}}, {DType::bf16, {1023, 1}}},
                   {un(UnaryOp::copy, f32, DType::bf16, 0), bin(BinaryOp::mul, DType::bf16, 2, 1),
                    un(UnaryOp::copy, DType::bf16, f32, 3), bin(BinaryOp::add, f32, 4, 0)}});
  // float64 with a row broadcast: max(a * b + row, d), min with NaN/Inf in every input.
  cases.push_back(
      {"f64 row broadcast max min",
       {9, 300},
       {{f64, {300, 1}}, {f64, {300, 1}}, {f64, {0, 1}}, {f64, {300, 1}}},
       {bin(BinaryOp::mul, f64, 0, 1), bin(BinaryOp::add, f64, 4, 2), bin(BinaryOp::max, f64, 5, 3),
        bin(BinaryOp::min, f64, 6, 0), un(UnaryOp::neg, f64, f64, 7)}});
  // int32 wraparound (full-range values): relu(where(a * b + a - b > c, max(.., c), -(..))).
  cases.push_back(
      {"int32 wraparound",
       {5000},
       {{i32, {1}}, {i32, {1}}, {i32, {1}, Fill::kSmallInts}},
       {bin(BinaryOp::mul, i32, 0, 1), bin(BinaryOp::add, i32, 3, 0), bin(BinaryOp::sub, i32, 4, 1),
        bin(BinaryOp::gt, i32, 5, 2), bin(BinaryOp::max, i32, 5, 2), un(UnaryOp::neg, i32, i32, 5),
        sel(i32, 6, 7, 8), un(UnaryOp::relu, i32, i32, 9)}});
  // int64 through float64 and back (astype saturates, NaN gives 0).
  cases.push_back({"int64 through f64",
                   {2049},
                   {{DType::i64, {1}}, {f64, {0}, Fill::kUnit}, {DType::i64, {1}}},
                   {un(UnaryOp::copy, DType::i64, f64, 0), bin(BinaryOp::mul, f64, 3, 1),
                    un(UnaryOp::copy, f64, DType::i64, 4), bin(BinaryOp::add, DType::i64, 5, 2)}});
  // A transposed input: relu(-(xT - y) * y + xT).
  cases.push_back(
      {"transposed",
       {33, 65},
       {{f32, {1, 33}}, {f32, {65, 1}}},
       {bin(BinaryOp::sub, f32, 0, 1), un(UnaryOp::neg, f32, f32, 2), bin(BinaryOp::mul, f32, 3, 1),
        bin(BinaryOp::add, f32, 4, 0), un(UnaryOp::relu, f32, f32, 5)}});
  // Rank 3 after merging: the general kernel.
  cases.push_back({"rank 3 strided",
                   {4, 5, 6},
                   {{f32, {30, 1, 5}}, {f32, {0, 6, 1}}, {f32, {1, 4, 20}}},
                   {bin(BinaryOp::mul, f32, 0, 1), bin(BinaryOp::add, f32, 3, 2),
                    bin(BinaryOp::min, f32, 4, 0), bin(BinaryOp::div, f32, 5, 1)}});
  // float16: x / s (s a broadcast scalar: through its reciprocal), then / (x + s) (a dense
  // intermediate divisor: a true division), then exp last.
  cases.push_back(
      {"f16 divisions",
       {2, 777},
       {{DType::f16, {777, 1}, Fill::kUnit}, {DType::f16, {0, 0}, Fill::kUnit}},
       {bin(BinaryOp::div, DType::f16, 0, 1), bin(BinaryOp::add, DType::f16, 0, 1),
        bin(BinaryOp::div, DType::f16, 2, 3), un(UnaryOp::exp, DType::f16, DType::f16, 4)},
       ulps(UnaryOp::exp, DType::f16)});
  // More elements than the grid has threads, with a row broadcast: the walk's grid-stride steps
  // (rows and columns both advance), in the float32 kernel and in the general one.
  cases.push_back({"grid stride f32 row broadcast",
                   {1000, 333},
                   {{f32, {333, 1}}, {f32, {0, 1}}},
                   {bin(BinaryOp::mul, f32, 0, 1), bin(BinaryOp::add, f32, 2, 0),
                    un(UnaryOp::relu, f32, f32, 3)}});
  cases.push_back({"grid stride general column broadcast",
                   {700, 501},
                   {{f64, {501, 1}}, {f64, {1, 0}}, {b8, {501, 1}}},
                   {bin(BinaryOp::lt, f64, 0, 1), bin(BinaryOp::add, b8, 3, 2), sel(f64, 4, 0, 1),
                    bin(BinaryOp::mul, f64, 5, 5)}});
  // Rank 3 in the general kernel: float64 values, a comparison and a select.
  cases.push_back(
      {"rank 3 general",
       {4, 5, 6},
       {{f64, {30, 1, 5}}, {f64, {0, 6, 1}}},
       {bin(BinaryOp::lt, f64, 0, 1), sel(f64, 2, 1, 0), bin(BinaryOp::sub, f64, 3, 1)}});
  // Rank 0: one element, no dimension to walk.
  cases.push_back({"rank 0",
                   {},
                   {{f32, {}}, {f32, {}}},
                   {bin(BinaryOp::mul, f32, 0, 1), bin(BinaryOp::add, f32, 2, 0)}});
  // Halves compared, astype to bool, a select of bfloat16 values.
  cases.push_back({"halves compare astype bool select bf16",
                   {31, 63},
                   {{DType::f16, {63, 1}},
                    {DType::f16, {63, 1}},
                    {DType::bf16, {63, 1}},
                    {DType::bf16, {0, 0}}},
                   {bin(BinaryOp::lt, DType::f16, 0, 1), un(UnaryOp::copy, DType::f16, b8, 0),
                    bin(BinaryOp::mul, b8, 4, 5), sel(DType::bf16, 6, 2, 3)}});
  // An input no op reads, and an op result no op reads.
  cases.push_back({"unused input and value",
                   {100},
                   {{f32, {1}}, {f32, {1}}, {f32, {1}}},
                   {bin(BinaryOp::mul, f32, 0, 2), un(UnaryOp::exp, f32, f32, 0),
                    bin(BinaryOp::add, f32, 3, 0)}});

  for (const Case& c : cases) {
    ElementwiseChain chain;
    chain.inputs = static_cast<int>(c.in.size());
    for (const In& i : c.in) chain.input_dtypes.push_back(i.t);
    chain.ops = c.ops;
    EXPECT_TRUE(cuda_->fuses_chain(chain)) << c.name << ": not fused";
    const DType out = chain.ops.back().out;
    const int64_t n = count(c.shape);
    std::vector<Host> host;
    std::vector<Strided> on_cpu, on_cuda;
    for (const In& i : c.in) {
      host.push_back(random(i.t, span(c.shape, i.strides), rng_, i.fill));
      on_cpu.push_back(Strided{host.back().bytes.data(), i.strides});
    }
    for (size_t k = 0; k < c.in.size(); ++k)
      on_cuda.push_back(Strided{upload(host[k], c.pad), c.in[k].strides});
    Host want = make(out, n);
    // The cpu's ops one after the other (its own chains refuse float16 division).
    cpu_->Backend::elementwise_chain(0, chain, c.shape, on_cpu,
                                     std::vector<void*>{want.bytes.data()});
    void* unfused = device_out(out, n, c.pad);
    cuda_->Backend::elementwise_chain(0, chain, c.shape, on_cuda, std::vector<void*>{unfused});
    void* fused = device_out(out, n, c.pad);
    if (c.in_place) {
      // A donated operand updated in place: y is input 0's memory (a fresh copy of it).
      fused = upload(host[0], c.pad);
      on_cuda[0].data = fused;
    }
    cuda_->elementwise_chain(0, chain, c.shape, on_cuda, std::vector<void*>{fused});
    const Host u = download(unfused, out, n), f = download(fused, out, n);
    int64_t differ = -1;
    for (int64_t e = 0; e < n && differ < 0; ++e) {
      const size_t sz = dtype_size(out);
      if (std::memcmp(u.bytes.data() + e * sz, f.bytes.data() + e * sz, sz) != 0) differ = e;
    }
    std::string what;
    EXPECT_EQ(differ, -1) << c.name << ": the fused chain's bits differ from the unfused ops' at "
                          << "element " << differ << " ("
                          << (first_mismatch(u, f, 0, what) < 0 ? "a NaN payload only" : what)
                          << ")";
    what.clear();
    EXPECT_EQ(first_mismatch(want, f, c.ulps, what), -1) << c.name << " against cpu: " << what;
    release();
  }

  // Refused (the unfused ops run instead, with their bits): more ops or inputs than the kernel
  // has room for, more values live at once than its register file, an integer division.
  ElementwiseChain long_chain;
  long_chain.inputs = 1;
  long_chain.input_dtypes = {f32};
  for (int i = 0; i < 33; ++i) long_chain.ops.push_back(un(UnaryOp::neg, f32, f32, i));
  EXPECT_FALSE(cuda_->fuses_chain(long_chain)) << "33 ops";
  ElementwiseChain wide;
  wide.inputs = 9;
  wide.input_dtypes.assign(9, f32);
  wide.ops.push_back(bin(BinaryOp::add, f32, 0, 8));
  EXPECT_FALSE(cuda_->fuses_chain(wide)) << "9 inputs";
  ElementwiseChain live;  // 17 results all live until the sums at the end
  live.inputs = 1;
  live.input_dtypes = {f32};
  for (int i = 0; i < 17; ++i) live.ops.push_back(un(UnaryOp::neg, f32, f32, 0));
  for (int i = 0; i < 16; ++i) {
    live.ops.push_back(bin(BinaryOp::add, f32, i == 0 ? 1 : 17 + i, i + 2));
  }
  EXPECT_FALSE(cuda_->fuses_chain(live)) << "17 values live at once";
  ElementwiseChain int_div;
  int_div.inputs = 2;
  int_div.input_dtypes = {i32, i32};
  int_div.ops.push_back(bin(BinaryOp::div, i32, 0, 1));
  EXPECT_FALSE(cuda_->fuses_chain(int_div)) << "integer division";
  // A refused chain still runs (the default): the long chain is 33 negations, -x.
  const Host x = random(f32, 1000, rng_, Fill::kUnit);
  void* dx = upload(x);
  void* dy = device_out(f32, 1000);
  const std::vector<Strided> in{Strided{dx, {1}}};
  cuda_->elementwise_chain(0, long_chain, {1000}, in, std::vector<void*>{dy});
  const Host y = download(dy, f32, 1000);
  for (int64_t e = 0; e < 1000; ++e) ASSERT_EQ(y.as<float>()[e], -x.as<float>()[e]) << e;
  // A chain with several outputs (adam's m and v, written and read again by the update): -x and
  // -x * x, and the same with its first output over x's own memory (a donated operand), and the
  // default (the ops through temporaries) writing the same.
  ElementwiseChain two;
  two.inputs = 1;
  two.input_dtypes = {f32};
  two.ops = {un(UnaryOp::neg, f32, f32, 0), bin(BinaryOp::mul, f32, 1, 0)};
  two.outputs = {1, 2};
  EXPECT_TRUE(cuda_->fuses_chain(two)) << "two outputs";
  for (int how = 0; how < 3; ++how) {
    void* dx2 = upload(x);
    void* d1 = how == 1 ? dx2 : device_out(f32, 1000);
    void* d2 = device_out(f32, 1000);
    const std::vector<Strided> in2{Strided{dx2, {1}}};
    if (how == 2) {
      cuda_->Backend::elementwise_chain(0, two, {1000}, in2, std::vector<void*>{d1, d2});
    } else {
      cuda_->elementwise_chain(0, two, {1000}, in2, std::vector<void*>{d1, d2});
    }
    const Host y1 = download(d1, f32, 1000), z = download(d2, f32, 1000);
    for (int64_t e = 0; e < 1000; ++e) {
      const float v = x.as<float>()[e];
      ASSERT_EQ(y1.as<float>()[e], -v) << "how " << how << " element " << e;
      ASSERT_EQ(z.as<float>()[e], -v * v) << "how " << how << " element " << e;
    }
  }
  // Constants (jit's scalar literals, as fill stores them): float32 (the float path) and bfloat16
  // (the general path), fused against the default's fill and kernels, and float32 against the host.
  auto constant = [](DType t, double v) {
    ChainOp o;
    o.kind = Kind::constant;
    o.in = o.out = t;
    o.value = v;
    return o;
  };
  const DType bf16 = DType::bf16;
  ElementwiseChain f32c, bf16c;
  f32c.inputs = bf16c.inputs = 1;
  f32c.input_dtypes = bf16c.input_dtypes = {f32};
  // 1 2.5, 2 -1/3, 3 x * 2.5, 4 that + -1/3
  f32c.ops = {constant(f32, 2.5), constant(f32, -1.0 / 3.0), bin(BinaryOp::mul, f32, 0, 1),
              bin(BinaryOp::add, f32, 3, 2)};
  // 1 bf16(x), 2 3.3 as bf16, 3 their product, 4 as float32
  bf16c.ops = {un(UnaryOp::copy, f32, bf16, 0), constant(bf16, 3.3), bin(BinaryOp::mul, bf16, 1, 2),
               un(UnaryOp::copy, bf16, f32, 3)};
  for (const ElementwiseChain* ch : {&f32c, &bf16c}) {
    EXPECT_TRUE(cuda_->fuses_chain(*ch));
    void* fused = device_out(f32, 1000);
    void* plain = device_out(f32, 1000);
    cuda_->elementwise_chain(0, *ch, {1000}, in, std::vector<void*>{fused});
    cuda_->Backend::elementwise_chain(0, *ch, {1000}, in, std::vector<void*>{plain});
    const Host a = download(fused, f32, 1000), b = download(plain, f32, 1000);
    ASSERT_EQ(0, std::memcmp(a.bytes.data(), b.bytes.data(), 4000))
        << (ch == &f32c ? "f32" : "bf16");
    if (ch == &f32c) {
      for (int64_t e = 0; e < 1000; ++e) {
        ASSERT_EQ(a.as<float>()[e], x.as<float>()[e] * 2.5f + static_cast<float>(-1.0 / 3.0)) << e;
      }
    }
  }
  ElementwiseChain const_out = f32c;  // a constant is never an output
  const_out.outputs = {1, 4};
  EXPECT_FALSE(cuda_->fuses_chain(const_out));
  ElementwiseChain nine = long_chain;  // 9 outputs: more than the kernel stores
  nine.ops.resize(9);
  for (int i = 0; i < 9; ++i) nine.outputs.push_back(1 + i);
  EXPECT_FALSE(cuda_->fuses_chain(nine)) << "9 outputs";
  release();
}

}  // namespace
}  // namespace meshrt

namespace meshrt {
namespace {

// Backend::copy_2d_batch (a resharding's copies, one launch per 64): every piece lands where a
// host model of the same copies puts it and nothing else in the destination changes, for copies
// of each access width (16, 8, 4, 1 bytes), contiguous and pitched, one row and many, more
// copies than one launch takes, and one large copy.
TEST_F(CudaKernels, CopyBatchMatchesHostModel) {
  constexpr size_t kBytes = (size_t{1} << 22) + 64;
  Host src = make(DType::i32, static_cast<int64_t>(kBytes / 4));
  for (size_t i = 0; i < src.bytes.size(); ++i)
    src.bytes[i] = static_cast<unsigned char>(i * 7 + 3);
  Host dst = make(DType::i32, static_cast<int64_t>(kBytes / 4));
  std::memset(dst.bytes.data(), 0x5a, dst.bytes.size());
  char* dsrc = static_cast<char*>(upload(src));
  char* ddst = static_cast<char*>(upload(dst));
  struct Piece {
    size_t dst_off, dpitch, src_off, spitch, width, height;
  };
  std::vector<Piece> pieces;
  size_t at = 0;  // destinations side by side, never overlapping
  auto add = [&](size_t src_off, size_t spitch, size_t width, size_t height, size_t dpitch,
                 size_t dalign) {
    at = (at + dalign - 1) / dalign * dalign + (dalign == 1 ? 1 : 0);
    pieces.push_back({at, dpitch, src_off, spitch, width, height});
    at += dpitch * (height - 1) + width + 16;
  };
  add(0, 4096, 4096, 1, 4096, 16);  // contiguous, 16-byte accesses
  add(64, 1024, 512, 33, 768, 16);  // pitched, 16-byte
  add(8, 1000, 200, 7, 216, 8);     // 8-byte
  add(4, 100, 36, 11, 40, 4);       // 4-byte
  add(3, 17, 5, 9, 6, 1);           // byte by byte
  for (int i = 0; i < 70; ++i) add(static_cast<size_t>(i) * 48, 96, 48, 3, 64, 16);  // > 64
  add(1 << 20, 1 << 20, 1 << 20, 2, 1 << 20, 16);  // large, contiguous rows as one run
  ASSERT_LT(at, kBytes);
  std::vector<backend::DeviceCopy> copies;
  for (const Piece& p : pieces) {
    copies.push_back(
        {ddst + p.dst_off, 0, p.dpitch, dsrc + p.src_off, 0, p.spitch, p.width, p.height});
    for (size_t r = 0; r < p.height; ++r) {
      std::memcpy(dst.bytes.data() + p.dst_off + r * p.dpitch,
                  src.bytes.data() + p.src_off + r * p.spitch, p.width);
    }
  }
  cuda_->copy_2d_batch(copies);
  const Host got = download(ddst, DType::i32, static_cast<int64_t>(kBytes / 4));
  size_t bad = 0;
  while (bad < kBytes && got.bytes[bad] == dst.bytes[bad]) ++bad;
  EXPECT_EQ(bad, kBytes) << "first wrong byte at " << bad;
  release();
}

}  // namespace
}  // namespace meshrt
