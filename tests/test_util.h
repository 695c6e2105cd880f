// tests/test_util.h: host-side references shared by the tests.
#pragma once

#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/detail/access.h"

namespace meshrt::test {

// Asserts that `stmt` throws meshrt::Error whose message contains every fragment.
#define EXPECT_MESHRT_ERROR(stmt, ...)                                                  \
  do {                                                                                  \
    try {                                                                               \
      stmt;                                                                             \
      ADD_FAILURE() << "expected meshrt::Error from " #stmt;                            \
    } catch (const ::meshrt::Error& e) {                                                \
      for (const std::string& frag : std::initializer_list<std::string>{__VA_ARGS__}) { \
        EXPECT_NE(std::string(e.what()).find(frag), std::string::npos)                  \
            << "message lacks \"" << frag << "\": " << e.what();                        \
      }                                                                                 \
    }                                                                                   \
  } while (0)

// Suites run on the default platform (tests/test_main.cpp pins it: cpu unless a cuda run).
inline std::string platform_prefix() { return default_platform() + ":"; }
// "cpu:3" or "cuda:3": the name of the default platform's device i.
inline std::string dev_name(int i) { return devices()[static_cast<size_t>(i)].str(); }

// A platform-parameterized suite's instance name: the platform ("Platforms/Ops.Creation/cuda"),
// so that a gtest filter (the cuda runs' CUDA_FILTER "*/cuda") can select one platform's cases.
inline std::string platform_param_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

// Why `platform` cannot hold a test that needs `need` of its devices ("" when it can): a cuda run
// has MESHRT_CUDA_DEVICES_PER_GPU logical devices per GPU, often fewer than the cpu suites' 8.
//   if (auto why = test::too_few_devices(4, GetParam()); !why.empty()) GTEST_SKIP() << why;
inline std::string too_few_devices(size_t need, const std::string& platform = default_platform()) {
  const size_t have = devices(platform).size();
  if (have >= need) return "";
  return "needs " + std::to_string(need) + " " + platform + " devices and the platform has " +
         std::to_string(have) + (platform == "cuda" ? " (raise MESHRT_CUDA_DEVICES_PER_GPU)" : "");
}

// The bytes of a Tensor's elements, read to the host through copy_to_host (Tensor::data() is a
// device address on cuda: never read it from a test). Bit-for-bit comparisons compare these.
inline std::vector<unsigned char> host_bytes(const Tensor& t) {
  std::vector<unsigned char> out(t.nbytes());
  if (!out.empty()) t.copy_to_host(out.data(), t.dtype());
  return out;
}

// Same dtype, shape, sharding, pending sums and bits (block by block, read back to the host):
// a jitted result against eager's.
inline void expect_same(const Array& a, const Array& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_TRUE(a.sharding() == b.sharding()) << a.sharding().str() << " vs " << b.sharding().str();
  EXPECT_EQ(a.pending_sum_axes(), b.pending_sum_axes());
  const std::vector<Tensor>& xs = detail::ArrayAccess::blocks(a);
  const std::vector<Tensor>& ys = detail::ArrayAccess::blocks(b);
  ASSERT_EQ(xs.size(), ys.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(xs[i].nbytes(), ys[i].nbytes());
    EXPECT_TRUE(host_bytes(xs[i]) == host_bytes(ys[i])) << "block " << i;
  }
}

// How many representable values lie between a and b: 0 for the same value (+0 and -0 too), 1
// for neighbours; the largest int64_t when either is NaN.
template <class F>
int64_t ulp_distance(F a, F b) {
  static_assert(std::is_same_v<F, float> || std::is_same_v<F, double>);
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<int64_t>::max();
  using U = std::conditional_t<std::is_same_v<F, float>, uint32_t, uint64_t>;
  // Sign-magnitude bits to an unsigned number line on which adjacent values differ by one.
  auto line = [](F f) {
    constexpr U sign = U{1} << (8 * sizeof(U) - 1);
    const U u = std::bit_cast<U>(f);
    return (u & sign) != 0 ? sign - (u & ~sign) : sign + u;
  };
  const U x = line(a), y = line(b);
  const U d = x > y ? x - y : y - x;
  return d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
             ? std::numeric_limits<int64_t>::max()
             : static_cast<int64_t>(d);
}

// The bound on a transcendental op's float result (sin, cos, exp, log, tanh) against the
// correctly rounded value (the float64 function rounded to float32): 2 ulp, the largest error
// CUDA documents for sinf/cosf/expf/tanhf (glibc's float functions stay under 1). Exact ops (+,
// -, *, / on the same inputs, integer ops) are compared exactly, not with this.
inline constexpr int64_t kTranscendentalUlps = 2;

// tests/data: MESHRT_TEST_DATA_DIR at run time (the GPU bundle's script sets it to its unpacked
// copy), else the source tree's folder compiled in.
inline std::string test_data_dir() {
  const char* env = std::getenv("MESHRT_TEST_DATA_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(MESHRT_TEST_DATA_DIR);
}

inline std::string read_data_file(const std::string& name) {
  std::string path = test_data_dir() + "/" + name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open test data " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every element of a Tensor or an Array as a double (any dtype), for host-side comparisons.
template <class X>
std::vector<double> host_values(const X& x) {
  switch (x.dtype()) {
    case DType::f32: {
      auto v = x.template to_vector<float>();
      return {v.begin(), v.end()};
    }
    case DType::f64:
      return x.template to_vector<double>();
    case DType::i32: {
      auto v = x.template to_vector<int32_t>();
      return {v.begin(), v.end()};
    }
    case DType::i64: {
      auto v = x.template to_vector<int64_t>();
      return {v.begin(), v.end()};
    }
    case DType::bool_: {
      auto v = x.template to_vector<bool>();
      return {v.begin(), v.end()};
    }
  }
  return {};
}

// Splits at `sep`; with `outside_parens`, only where no parenthesis is open.
inline std::vector<std::string> split(const std::string& s, char sep, bool outside_parens = false) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (outside_parens && c == '(') ++depth;
    if (outside_parens && c == ')') --depth;
    if (c == sep && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

inline std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Decodes the data files' spec notation: entries split by '|', axes by '+', '-' = None.
inline PartitionSpec parse_spec(const std::string& enc) {
  std::vector<PartitionSpec::Entry> entries;
  if (enc.empty()) return PartitionSpec(entries);
  for (const std::string& e : split(enc, '|')) {
    entries.push_back(e == "-" ? PartitionSpec::Entry{} : split(e, '+'));
  }
  return PartitionSpec(entries);
}

inline Shape parse_shape(const std::string& s) {
  Shape out;
  if (s.empty()) return out;
  for (const std::string& d : split(s, ',')) out.push_back(std::stoll(d));
  return out;
}

// The host reference of a block: elements of the row-major `global` array inside `idx`.
template <class T>
std::vector<T> host_slice(const std::vector<T>& global, const Shape& shape, const Index& idx) {
  std::vector<T> out;
  size_t rank = shape.size();
  if (rank == 0) return global;
  for (auto& [a, b] : idx) {
    if (a >= b) return out;
  }
  std::vector<int64_t> pos(rank);
  for (size_t d = 0; d < rank; ++d) pos[d] = idx[d].first;
  for (;;) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) flat = flat * shape[d] + pos[d];
    out.push_back(global[static_cast<size_t>(flat)]);
    size_t d = rank;
    while (d-- > 0) {
      if (++pos[d] < idx[d].second) break;
      pos[d] = idx[d].first;
      if (d == 0) return out;
    }
  }
}

// ---- the notation of gen_global_view.py and gen_autodiff.py (specs "x|None|(x,y)", "-" = P(),
// shapes "8,4" or "scalar")
namespace view_data {

// Splits at `sep` outside parentheses.
inline std::vector<std::string> split_top(const std::string& s, char sep) {
  return split(s, sep, true);
}

// "-" is P(); entries separated by '|', "None", a name, or "(a,b)".
inline PartitionSpec parse_spec(const std::string& s) {
  if (s == "-") return P();
  std::vector<PartitionSpec::Entry> entries;
  for (const std::string& e : split_top(s, '|')) {
    if (e == "None") {
      entries.emplace_back();
    } else if (e.front() == '(') {
      entries.push_back(split_top(e.substr(1, e.size() - 2), ','));
    } else {
      entries.push_back({e});
    }
  }
  return PartitionSpec(entries);
}

// "scalar" or comma-separated dimensions.
inline Shape parse_shape(const std::string& s) {
  if (s == "scalar") return {};
  Shape out;
  for (const std::string& v : split_top(s, ',')) out.push_back(std::stoll(v));
  return out;
}

inline DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "f64") return DType::f64;
  if (s == "i32") return DType::i32;
  if (s == "i64") return DType::i64;
  if (s == "bool") return DType::bool_;
  throw std::runtime_error("unknown dtype " + s);
}

}  // namespace view_data

}  // namespace meshrt::test
