// tests/test_util.h: host-side references shared by the tests.
#pragma once

#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

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

inline std::string read_data_file(const std::string& name) {
  std::string path = std::string(MESHRT_TEST_DATA_DIR) + "/" + name;
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
