#include "core/dtype.h"

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
  }
  return "unknown";
}

bool is_floating(DType dtype) { return dtype == DType::f32 || dtype == DType::f64; }

int64_t shape_size(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
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
