// train/json.cpp: a recursive-descent parser with a depth limit, and an indenting writer.
#include "train/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/strings.h"

namespace meshrt::detail::json {

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::number;
  v.is_int_ = true;
  v.i_ = i;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::number;
  v.d_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::string;
  v.s_ = std::move(s);
  return v;
}
Value Value::array(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::array;
  v.items_ = std::move(items);
  return v;
}
Value Value::object(std::vector<std::pair<std::string, Value>> members) {
  Value v;
  v.kind_ = Kind::object;
  v.members_ = std::move(members);
  return v;
}

const Value* Value::find(std::string_view key) const {
  if (kind_ != Kind::object) return nullptr;
  for (const auto& [k, v] : members_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value& Value::push(Value v) {
  items_.push_back(std::move(v));
  return items_.back();
}

Value& Value::set(std::string key, Value v) {
  for (auto& [k, old] : members_) {
    if (k == key) return old = std::move(v);
  }
  members_.emplace_back(std::move(key), std::move(v));
  return members_.back().second;
}

void Value::append(std::string key, Value v) {
  members_.emplace_back(std::move(key), std::move(v));
}

namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  Parser(std::string_view text, std::string_view what) : t_(text), what_(what) {}

  Value document() {
    Value v = value(0);
    skip_ws();
    if (at_ != t_.size()) fail("text after the end of the document");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view why) const {
    throw Error(cat(what_, ": not valid JSON: ", why, " at byte ", at_));
  }
  void skip_ws() {
    while (at_ < t_.size() &&
           (t_[at_] == ' ' || t_[at_] == '\n' || t_[at_] == '\r' || t_[at_] == '\t'))
      ++at_;
  }
  bool eat(char c) {
    skip_ws();
    if (at_ < t_.size() && t_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(cat("expected '", std::string(1, c), "'"));
  }
  bool literal(std::string_view word) {
    if (t_.substr(at_, word.size()) == word) {
      at_ += word.size();
      return true;
    }
    return false;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 64");
    skip_ws();
    if (at_ >= t_.size()) fail("unexpected end");
    const char c = t_[at_];
    if (c == '{') {
      ++at_;
      Value obj = Value::object();
      if (eat('}')) return obj;
      do {
        skip_ws();
        if (at_ >= t_.size() || t_[at_] != '"') fail("expected a member name");
        std::string key = string();
        expect(':');
        obj.append(std::move(key), value(depth + 1));
      } while (eat(','));
      expect('}');
      return obj;
    }
    if (c == '[') {
      ++at_;
      Value arr = Value::array();
      if (eat(']')) return arr;
      do {
        arr.push(value(depth + 1));
      } while (eat(','));
      expect(']');
      return arr;
    }
    if (c == '"') return Value::string(string());
    if (literal("true")) return Value::boolean(true);
    if (literal("false")) return Value::boolean(false);
    if (literal("null")) return Value();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail("unexpected character");
  }

  Value number() {
    const size_t begin = at_;
    bool is_int = true;
    if (t_[at_] == '-') ++at_;
    auto digits = [&] {
      const size_t d0 = at_;
      while (at_ < t_.size() && t_[at_] >= '0' && t_[at_] <= '9') ++at_;
      if (at_ == d0) fail("malformed number");
    };
    digits();
    if (at_ < t_.size() && t_[at_] == '.') {
      ++at_;
      is_int = false;
      digits();
    }
    if (at_ < t_.size() && (t_[at_] == 'e' || t_[at_] == 'E')) {
      ++at_;
      is_int = false;
      if (at_ < t_.size() && (t_[at_] == '+' || t_[at_] == '-')) ++at_;
      digits();
    }
    const char* first = t_.data() + begin;
    const char* last = t_.data() + at_;
    if (is_int) {
      int64_t i = 0;
      auto [p, ec] = std::from_chars(first, last, i);
      if (ec == std::errc() && p == last) return Value::integer(i);
    }
    double d = 0;
    auto [p, ec] = std::from_chars(first, last, d);
    if (ec != std::errc() || p != last) fail("number out of range");
    return Value::number(d);
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex4() {
    if (at_ + 4 > t_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = t_[at_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        fail("bad \\u escape");
      }
    }
    return v;
  }

  std::string string() {
    ++at_;  // the opening quote
    std::string out;
    while (true) {
      if (at_ >= t_.size()) fail("unterminated string");
      const char c = t_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= t_.size()) fail("unterminated string");
      const char e = t_[at_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (!literal("\\u")) fail("unpaired surrogate");
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  std::string_view t_;
  std::string_view what_;
  size_t at_ = 0;
};

void write_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void write(std::string& out, const Value& v, int indent) {
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  const std::string close(static_cast<size_t>(indent), ' ');
  switch (v.kind()) {
    case Value::Kind::null:
      out += "null";
      return;
    case Value::Kind::boolean:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::number: {
      char buf[64];
      if (v.is_integer()) {
        auto r = std::to_chars(buf, buf + sizeof buf, v.as_int());
        out.append(buf, r.ptr);
      } else {
        const double d = v.as_double();
        MESHRT_DCHECK(std::isfinite(d));  // NaN/Infinity are strings in Zarr metadata
        auto r = std::to_chars(buf, buf + sizeof buf, d);
        std::string_view s(buf, static_cast<size_t>(r.ptr - buf));
        out += s;
        if (s.find_first_of(".eE") == std::string_view::npos) out += ".0";
      }
      return;
    }
    case Value::Kind::string:
      write_string(out, v.as_string());
      return;
    case Value::Kind::array:
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += "[\n";
      for (size_t i = 0; i < v.items().size(); ++i) {
        out += pad;
        write(out, v.items()[i], indent + 2);
        out += i + 1 < v.items().size() ? ",\n" : "\n";
      }
      out += close + "]";
      return;
    case Value::Kind::object:
      if (v.members().empty()) {
        out += "{}";
        return;
      }
      out += "{\n";
      for (size_t i = 0; i < v.members().size(); ++i) {
        out += pad;
        write_string(out, v.members()[i].first);
        out += ": ";
        write(out, v.members()[i].second, indent + 2);
        out += i + 1 < v.members().size() ? ",\n" : "\n";
      }
      out += close + "}";
      return;
  }
}

}  // namespace

Value parse(std::string_view text, std::string_view what) { return Parser(text, what).document(); }

std::string dump(const Value& v) {
  std::string out;
  write(out, v, 0);
  out += '\n';
  return out;
}

}  // namespace meshrt::detail::json
