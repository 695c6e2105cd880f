#include "core/dtype.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <system_error>

#include "core/error.h"
#include "core/strings.h"

namespace meshrt {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::bool_:
      return 1;
    case DType::bf16:
    case DType::f16:
      return 2;
  }
  throw Error("[dtype] unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

std::string_view precision_name(Precision p) { return p == Precision::tf32 ? "tf32" : "highest"; }

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::bool_:
      return "bool";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
  }
  return "unknown";
}

std::string_view dtype_cpp_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float";
    case DType::f64:
      return "double";
    case DType::i32:
      return "int32_t";
    case DType::i64:
      return "int64_t";
    case DType::bool_:
      return "bool";
    case DType::bf16:
      return "meshrt::bfloat16";
    case DType::f16:
      return "meshrt::float16";
  }
  return "unknown";
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || is_half(dtype);
}

int64_t shape_size(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {
template <class T>
void append_value(std::string& s, T v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    s += v != 0 ? "true" : "false";
  } else if constexpr (std::is_floating_point_v<T>) {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    std::string t(buf, ec == std::errc() ? end : buf);
    // NumPy marks integral floats with a trailing dot: "2." is a float, "2" an integer.
    if (t.find_first_of(".eni") == std::string::npos) t += ".";
    s += t;
  } else if constexpr (is_half_v<T>) {
    // The shortest decimal that reads back as the same 16-bit value (as NumPy's repr).
    const float f = static_cast<float>(v);
    if (f != f || f - f != 0.0f) {
      append_value(s, f);  // nan, inf, -inf
      return;
    }
    char buf[64];
    for (int p = 1; p <= 9; ++p) {
      std::snprintf(buf, sizeof buf, "%.*g", p, static_cast<double>(f));
      if (T(std::strtof(buf, nullptr)).bits() == v.bits()) break;
    }
    std::string t(buf);
    if (t.find_first_of(".eni") == std::string::npos) t += ".";
    s += t;
  } else {
    s += std::to_string(v);
  }
}

template <class T>
void append_values(std::string& s, const T* data, const Shape& shape, size_t dim, int64_t& at) {
  if (dim == shape.size()) {
    append_value(s, data[at++]);
    return;
  }
  s += "[";
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (i) s += ", ";
    append_values(s, data, shape, dim + 1, at);
  }
  s += "]";
}
}  // namespace

std::string detail::values_str(const void* data, DType dtype, const Shape& shape) {
  std::string s;
  int64_t at = 0;
  switch (dtype) {
    case DType::f32:
      append_values(s, static_cast<const float*>(data), shape, 0, at);
      break;
    case DType::f64:
      append_values(s, static_cast<const double*>(data), shape, 0, at);
      break;
    case DType::i32:
      append_values(s, static_cast<const int32_t*>(data), shape, 0, at);
      break;
    case DType::i64:
      append_values(s, static_cast<const int64_t*>(data), shape, 0, at);
      break;
    case DType::bool_:
      append_values(s, static_cast<const uint8_t*>(data), shape, 0, at);
      break;
    case DType::bf16:
      append_values(s, static_cast<const bfloat16*>(data), shape, 0, at);
      break;
    case DType::f16:
      append_values(s, static_cast<const float16*>(data), shape, 0, at);
      break;
  }
  return s;
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

namespace detail {
std::string names_tuple(const std::vector<std::string>& names) {
  std::string s = "(";
  s += join(names, ", ", [](const std::string& n) { return quote(n); });
  if (names.size() == 1) s += ",";
  return s + ")";
}
}  // namespace detail

}  // namespace meshrt
