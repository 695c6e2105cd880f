// train/zarr.cpp: Zarr v3 metadata in and out.
#include "train/zarr.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/half.h"
#include "core/strings.h"

namespace meshrt::detail::zarr {
namespace {

struct TypeName {
  DType dtype;
  std::string_view name;
};
constexpr TypeName kTypes[] = {
    {DType::f32, "float32"},
    {DType::f64, "float64"},
    {DType::i32, "int32"},
    {DType::i64, "int64"},
    {DType::bool_, "bool"},
    {DType::f16, "float16"},
    // Not a core Zarr v3 type: the registered extension (zarr-extensions data-types/bfloat16),
    // as tensorstore (orbax's writer) and zarrs spell it.
    {DType::bf16, "bfloat16"},
};

using json::Value;

const Value& member(const Value& obj, std::string_view key, const std::string& what) {
  const Value* v = obj.find(key);
  if (v == nullptr) throw Error(cat(what, ": zarr.json has no \"", key, "\""));
  return *v;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r) || r > (int64_t{1} << 56)) {
    throw Error(cat(what, ": zarr.json describes sizes too large to hold (overflow)"));
  }
  return r;
}

Shape int_list(const Value& v, std::string_view name, int64_t min, const std::string& what) {
  if (!v.is_array() || v.items().size() > 64) {
    throw Error(cat(what, ": zarr.json's \"", name, "\" is not a list of at most 64 integers"));
  }
  Shape out;
  for (const Value& e : v.items()) {
    if (!e.is_integer() || e.as_int() < min) {
      throw Error(
          cat(what, ": zarr.json's \"", name, "\" holds an entry that is not an integer >= ", min));
    }
    out.push_back(e.as_int());
  }
  return out;
}

template <class T>
void put(std::vector<unsigned char>& out, T v) {
  out.resize(sizeof(T));
  std::memcpy(out.data(), &v, sizeof(T));
}

std::vector<unsigned char> parse_fill(const Value& v, DType dtype, const std::string& what) {
  std::vector<unsigned char> out;
  auto bad = [&]() -> std::vector<unsigned char> {
    throw Error(
        cat(what, ": zarr.json's fill_value does not fit data type ", data_type_name(dtype)));
  };
  // A float fill value: a number, "NaN"/"Infinity"/"-Infinity", or the bit pattern as "0x" and
  // two hex digits per byte of the type. `bits` holds that pattern when one was given.
  std::optional<uint64_t> bits;
  auto float_value = [&](size_t width) -> std::optional<double> {
    if (v.is_number()) return v.as_double();
    if (!v.is_string()) return std::nullopt;
    const std::string& s = v.as_string();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    if (s.size() == 2 + 2 * width && s.starts_with("0x")) {  // the bit pattern
      uint64_t b = 0;
      for (char c : s.substr(2)) {
        const int d = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
        if (d < 0) return std::nullopt;
        b = b << 4 | static_cast<uint64_t>(d);
      }
      bits = b;
      return 0.0;
    }
    return std::nullopt;
  };
  switch (dtype) {
    case DType::f32: {
      auto d = float_value(4);
      if (!d) return bad();
      if (bits) {
        put(out, static_cast<uint32_t>(*bits));
      } else {
        put(out, static_cast<float>(*d));
      }
      return out;
    }
    case DType::f64: {
      auto d = float_value(8);
      if (!d) return bad();
      if (bits) {
        put(out, *bits);
      } else {
        put(out, *d);
      }
      return out;
    }
    case DType::bf16: {
      auto d = float_value(2);
      if (!d) return bad();
      put(out, bits ? static_cast<uint16_t>(*bits) : bfloat16(*d).bits());
      return out;
    }
    case DType::f16: {
      auto d = float_value(2);
      if (!d) return bad();
      put(out, bits ? static_cast<uint16_t>(*bits) : float16(*d).bits());
      return out;
    }
    case DType::i32:
      if (!v.is_integer() || v.as_int() < INT32_MIN || v.as_int() > INT32_MAX) return bad();
      put(out, static_cast<int32_t>(v.as_int()));
      return out;
    case DType::i64:
      if (!v.is_integer()) return bad();
      put(out, v.as_int());
      return out;
    case DType::bool_:
      if (!v.is_bool()) return bad();
      put(out, static_cast<uint8_t>(v.as_bool() ? 1 : 0));
      return out;
  }
  return bad();
}

}  // namespace

std::string_view data_type_name(DType dtype) {
  for (const TypeName& t : kTypes) {
    if (t.dtype == dtype) return t.name;
  }
  throw Error(cat("[checkpoint] dtype ", dtype_name(dtype),
                  " has no Zarr v3 data type here; astype the leaf to float32 before saving"));
}

std::optional<DType> data_type_from_name(std::string_view name) {
  for (const TypeName& t : kTypes) {
    if (t.name == name) return t.dtype;
  }
  return std::nullopt;
}

json::Value array_json(const ArrayMeta& meta, json::Value attributes) {
  auto ints = [](const Shape& s) {
    Value a = Value::array();
    for (int64_t v : s) a.push(Value::integer(v));
    return a;
  };
  Value doc = Value::object();
  doc.set("zarr_format", Value::integer(3));
  doc.set("node_type", Value::string("array"));
  doc.set("shape", ints(meta.shape));
  doc.set("data_type", Value::string(std::string(data_type_name(meta.dtype))));
  Value grid_conf = Value::object();
  grid_conf.set("chunk_shape", ints(meta.chunk_shape));
  Value grid = Value::object();
  grid.set("name", Value::string("regular"));
  grid.set("configuration", std::move(grid_conf));
  doc.set("chunk_grid", std::move(grid));
  Value key_conf = Value::object();
  key_conf.set("separator", Value::string("/"));
  Value keys = Value::object();
  keys.set("name", Value::string("default"));
  keys.set("configuration", std::move(key_conf));
  doc.set("chunk_key_encoding", std::move(keys));
  switch (meta.dtype) {
    case DType::f32:
    case DType::f64:
    case DType::bf16:
    case DType::f16:
      doc.set("fill_value", Value::number(0.0));
      break;
    case DType::bool_:
      doc.set("fill_value", Value::boolean(false));
      break;
    default:
      doc.set("fill_value", Value::integer(0));
      break;
  }
  Value codecs = Value::array();
  Value bytes = Value::object();
  bytes.set("name", Value::string("bytes"));
  if (dtype_size(meta.dtype) > 1) {  // one-byte types have no byte order (as zarr-python writes)
    Value conf = Value::object();
    conf.set("endian", Value::string("little"));
    bytes.set("configuration", std::move(conf));
  }
  codecs.push(std::move(bytes));
  Value crc = Value::object();
  crc.set("name", Value::string("crc32c"));
  codecs.push(std::move(crc));
  doc.set("codecs", std::move(codecs));
  doc.set("attributes", std::move(attributes));
  return doc;
}

json::Value group_json(json::Value attributes) {
  Value doc = Value::object();
  doc.set("zarr_format", Value::integer(3));
  doc.set("node_type", Value::string("group"));
  doc.set("attributes", std::move(attributes));
  return doc;
}

ArrayMeta parse_array(const json::Value& doc, const std::string& what) {
  if (!doc.is_object()) throw Error(cat(what, ": zarr.json is not a JSON object"));
  const Value& format = member(doc, "zarr_format", what);
  if (!format.is_integer() || format.as_int() != 3) {
    throw Error(cat(what, ": zarr.json is not Zarr format 3 (zarr_format must be 3)"));
  }
  const Value& node = member(doc, "node_type", what);
  if (!node.is_string() || node.as_string() != "array") {
    throw Error(cat(what, ": zarr.json is not an array (node_type \"",
                    node.is_string() ? node.as_string() : std::string("?"), "\")"));
  }
  ArrayMeta m;
  m.shape = int_list(member(doc, "shape", what), "shape", 0, what);
  const Value& dt = member(doc, "data_type", what);
  std::optional<DType> dtype = dt.is_string() ? data_type_from_name(dt.as_string()) : std::nullopt;
  if (!dtype) {
    throw Error(
        cat(what, ": data_type ", dt.is_string() ? quote(dt.as_string()) : "(not a name)",
            " is not one meshrt reads (float32, float64, float16, bfloat16, int32, int64, bool)"));
  }
  m.dtype = *dtype;

  const Value& grid = member(doc, "chunk_grid", what);
  const Value* grid_name = grid.find("name");
  const Value* grid_conf = grid.find("configuration");
  if (grid_name == nullptr || !grid_name->is_string() || grid_name->as_string() != "regular" ||
      grid_conf == nullptr || grid_conf->find("chunk_shape") == nullptr) {
    throw Error(cat(what, ": the chunk grid is not \"regular\" with a chunk_shape"));
  }
  m.chunk_shape = int_list(*grid_conf->find("chunk_shape"), "chunk_shape", 1, what);
  if (m.chunk_shape.size() != m.shape.size()) {
    throw Error(cat(what, ": chunk_shape ", shape_str(m.chunk_shape),
                    " has another rank than shape ", shape_str(m.shape)));
  }

  if (const Value* keys = doc.find("chunk_key_encoding")) {
    const Value* name = keys->find("name");
    const Value* conf = keys->find("configuration");
    const Value* sep = conf != nullptr ? conf->find("separator") : nullptr;
    if (name == nullptr || !name->is_string() ||
        (name->as_string() != "default" && name->as_string() != "v2")) {
      throw Error(cat(what, ": chunk_key_encoding is neither \"default\" nor \"v2\""));
    }
    m.v2_keys = name->as_string() == "v2";
    m.separator = m.v2_keys ? '.' : '/';
    if (sep != nullptr) {
      if (!sep->is_string() || (sep->as_string() != "/" && sep->as_string() != ".")) {
        throw Error(cat(what, ": the chunk key separator is neither \"/\" nor \".\""));
      }
      m.separator = sep->as_string()[0];
    }
  }

  const Value& codecs = member(doc, "codecs", what);
  if (!codecs.is_array() || codecs.items().empty()) {
    throw Error(cat(what, ": zarr.json's codecs is not a non-empty list"));
  }
  m.crc32c = false;
  for (size_t i = 0; i < codecs.items().size(); ++i) {
    const Value& c = codecs.items()[i];
    const Value* name = c.find("name");
    const std::string n = name != nullptr && name->is_string() ? name->as_string() : "?";
    if (i == 0 && n == "bytes") {
      const Value* conf = c.find("configuration");
      const Value* endian = conf != nullptr ? conf->find("endian") : nullptr;
      if (endian != nullptr && (!endian->is_string() || endian->as_string() != "little") &&
          dtype_size(m.dtype) > 1) {
        throw Error(cat(what,
                        ": the bytes codec is big-endian; meshrt reads little-endian chunks "
                        "(rewrite the array with endian \"little\")"));
      }
    } else if (i == 1 && n == "crc32c" && codecs.items().size() == 2) {
      m.crc32c = true;
    } else {
      throw Error(cat(what, ": codec ", quote(n), " at position ", i,
                      " is not supported; meshrt reads the codecs [bytes] and [bytes, crc32c]"));
    }
  }
  m.fill_value = parse_fill(member(doc, "fill_value", what), m.dtype, what);
  // Sizes are bounded before anything is allocated from them.
  int64_t total = static_cast<int64_t>(dtype_size(m.dtype));
  for (int64_t c : m.chunk_shape) total = checked_mul(total, c, what);
  int64_t elems = 1;
  for (int64_t s : m.shape) elems = checked_mul(elems, s, what);
  return m;
}

std::string chunk_key(const ArrayMeta& meta, const std::vector<int64_t>& coords) {
  std::string key = meta.v2_keys ? "" : "c";
  for (size_t d = 0; d < coords.size(); ++d) {
    if (!key.empty()) key += meta.separator;
    key += std::to_string(coords[d]);
  }
  if (key.empty()) key = "0";  // v2, rank 0
  return key;
}

std::vector<int64_t> grid_shape(const ArrayMeta& meta) {
  std::vector<int64_t> g(meta.shape.size());
  for (size_t d = 0; d < g.size(); ++d) {
    g[d] = (meta.shape[d] + meta.chunk_shape[d] - 1) / meta.chunk_shape[d];
  }
  return g;
}

int64_t chunk_elements(const ArrayMeta& meta) { return shape_size(meta.chunk_shape); }

int64_t encoded_chunk_bytes(const ArrayMeta& meta) {
  return chunk_elements(meta) * static_cast<int64_t>(dtype_size(meta.dtype)) +
         (meta.crc32c ? 4 : 0);
}

}  // namespace meshrt::detail::zarr
