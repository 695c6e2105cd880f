// train/zarr.h: the part of Zarr v3 a checkpoint uses: array and group metadata (zarr.json),
// regular chunk grids, chunk keys, and the bytes (+ crc32c) codec chain.
//
// Spec: zarr-specs v3.0 core ("zarr.json", "chunk_key_encoding" default / v2, "regular" chunk
// grid, the "bytes" codec) and the crc32c codec (a 4-byte little-endian CRC-32C of the encoded
// chunk appended to it). Other codecs (compression, transpose, sharding) are refused by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "train/json.h"

namespace meshrt::detail::zarr {

// One array's metadata, as far as meshrt reads and writes it.
struct ArrayMeta {
  Shape shape;
  DType dtype = DType::f32;
  Shape chunk_shape;     // every entry >= 1
  bool v2_keys = false;  // chunk_key_encoding "v2" ("0.1"), else "default" ("c/0/1")
  char separator = '/';
  bool crc32c = true;                     // codecs: bytes, then crc32c
  std::vector<unsigned char> fill_value;  // one element, little-endian
};

// Zarr v3 data type names: "float32", "float64", "float16", "int32", "int64", "bool" (core
// types) and "bfloat16" (the registered extension data type, as tensorstore writes it).
std::string_view data_type_name(DType dtype);
std::optional<DType> data_type_from_name(std::string_view name);

// The array's zarr.json (zarr_format 3, node_type array, fill value 0 / false, codecs bytes
// little-endian + crc32c), with `attributes`.
json::Value array_json(const ArrayMeta& meta, json::Value attributes);
// A group's zarr.json.
json::Value group_json(json::Value attributes);

// Reads an array's zarr.json. Anything meshrt cannot read (another node type or format, an
// unknown data type, a chunk grid of another rank, a codec other than bytes/crc32c, a big-endian
// bytes codec, sizes that overflow) is an Error starting with `what`.
ArrayMeta parse_array(const json::Value& doc, const std::string& what);

// The key of the chunk at grid coordinates `coords`, relative to the array's folder:
// "c/0/1" (default, "/"), "c.0.1" (default, "."), "0.1" (v2); rank 0: "c" / "0".
std::string chunk_key(const ArrayMeta& meta, const std::vector<int64_t>& coords);
// Chunks along each dimension: ceil(shape / chunk_shape).
std::vector<int64_t> grid_shape(const ArrayMeta& meta);
// Elements in one chunk, and the bytes of its encoded form (with the checksum).
int64_t chunk_elements(const ArrayMeta& meta);
int64_t encoded_chunk_bytes(const ArrayMeta& meta);

}  // namespace meshrt::detail::zarr
