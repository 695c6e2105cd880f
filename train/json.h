// train/json.h: the small JSON reader and writer of the checkpoint format's zarr.json files.
//
// Not a general JSON library: it parses what Zarr v3 metadata holds (objects, arrays, strings,
// numbers, true/false/null) with bounded depth, keeps integers exact (int64), and writes
// indented UTF-8 text. Malformed input is a meshrt::Error saying where.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshrt::detail::json {

class Value {
 public:
  enum class Kind { null, boolean, number, string, array, object };
  Value() = default;
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);  // written with a fraction or exponent ("0.0")
  static Value string(std::string s);
  static Value array(std::vector<Value> items = {});
  static Value object(std::vector<std::pair<std::string, Value>> members = {});

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_number() const { return kind_ == Kind::number; }
  // A number written without fraction or exponent that fits an int64.
  bool is_integer() const { return kind_ == Kind::number && is_int_; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return is_int_ ? static_cast<double>(i_) : d_; }
  const std::string& as_string() const { return s_; }
  const std::vector<Value>& items() const { return items_; }
  const std::vector<std::pair<std::string, Value>>& members() const { return members_; }

  // The member called `key` of an object, else nullptr (also for a non-object).
  const Value* find(std::string_view key) const;
  // Appends to an array / sets a member of an object (replacing one of the same key).
  Value& push(Value v);
  Value& set(std::string key, Value v);
  // Appends a member without looking for one of the same key (the parser: find() sees the first).
  void append(std::string key, Value v);

 private:
  Kind kind_ = Kind::null;
  bool b_ = false;
  bool is_int_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

// Parses one JSON document (nesting at most 64 deep); an Error "<what>: not valid JSON: ... at
// byte N" otherwise.
Value parse(std::string_view text, std::string_view what);
// Indented JSON text (two spaces), ending in a newline.
std::string dump(const Value& v);

}  // namespace meshrt::detail::json
