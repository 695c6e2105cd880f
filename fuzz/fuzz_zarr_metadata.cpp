// libFuzzer target: a checkpoint array's zarr.json (train/json, train/zarr), as restore reads it:
// parse, then the chunk grid, sizes and keys of its first and last chunk. Anything malformed must
// be a meshrt::Error; no input may crash or allocate by a size it chooses.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "train/json.h"
#include "train/zarr.h"

namespace zarr = meshrt::detail::zarr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const zarr::ArrayMeta meta =
        zarr::parse_array(meshrt::detail::json::parse(text, "fuzz: zarr.json"), "fuzz");
    const std::vector<int64_t> grid = zarr::grid_shape(meta);
    (void)zarr::chunk_elements(meta);
    (void)zarr::encoded_chunk_bytes(meta);
    std::vector<int64_t> first(grid.size(), 0), last(grid.size(), 0);
    for (size_t d = 0; d < grid.size(); ++d) last[d] = grid[d] > 0 ? grid[d] - 1 : 0;
    (void)zarr::chunk_key(meta, first);
    (void)zarr::chunk_key(meta, last);
  } catch (const meshrt::Error&) {  // a clear error is the answer to a bad file
  }
  return 0;
}
