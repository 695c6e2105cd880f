// libFuzzer target: meshes, PartitionSpecs and NamedShardings built from arbitrary shapes and
// names (runtime/mesh, partition_spec, sharding), over 8 cpu devices. The input is four lines:
//   mesh shape        "4 2"        integers (any int64, negative included)
//   axis names        "x y"        one per mesh dimension
//   spec entries      "x,,y z"     comma-separated; an entry's names space-separated, empty = None
//   array shape       "8 6"
// make_mesh, NamedSharding, shard_shape, devices_indices_map and str() must return or throw
// meshrt::Error; no input may crash, overflow or allocate by a size it chooses.
#include <meshrt/meshrt.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (true) {
    const size_t next = s.find(sep, at);
    out.push_back(s.substr(at, next == std::string_view::npos ? next : next - at));
    if (next == std::string_view::npos) return out;
    at = next + 1;
  }
}

// Space-separated words; empty words (repeated spaces) are dropped.
std::vector<std::string> words(std::string_view s) {
  std::vector<std::string> out;
  for (std::string_view w : split(s, ' ')) {
    if (!w.empty()) out.emplace_back(w);
  }
  return out;
}

// Space-separated integers; a word that is not one is skipped.
meshrt::Shape integers(std::string_view s) {
  meshrt::Shape out;
  for (const std::string& w : words(s)) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    if (ec == std::errc() && end == w.data() + w.size()) out.push_back(v);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("MESHRT_CPU_DEVICES", "8", 1);
  setenv("MESHRT_PLATFORM", "cpu", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> lines = split(text, '\n');
  lines.resize(4);
  // Bounded so that one input stays fast: 8 devices bound the mesh anyway.
  if (lines[0].size() > 256 || lines[2].size() > 4096) return 0;
  const meshrt::Shape mesh_shape = integers(lines[0]);
  const std::vector<std::string> names = words(lines[1]);
  std::vector<meshrt::PartitionSpec::Entry> entries;
  if (!lines[2].empty()) {
    for (std::string_view e : split(lines[2], ',')) entries.push_back(words(e));
  }
  const meshrt::Shape shape = integers(lines[3]);
  try {
    const meshrt::PartitionSpec spec(entries);
    (void)spec.str();
    (void)spec.axes();
    const meshrt::Mesh mesh = meshrt::make_mesh(mesh_shape, names);
    (void)mesh.str();
    for (const std::string& n : names) (void)mesh.axis_position(n);
    const meshrt::NamedSharding sharding(mesh, spec);
    (void)sharding.str();
    (void)sharding.is_fully_replicated();
    (void)(sharding == meshrt::NamedSharding(mesh, meshrt::PartitionSpec()));
    (void)sharding.shard_shape(shape);
    (void)sharding.devices_indices_map(shape);
    (void)sharding.is_equivalent_to(sharding, shape);
  } catch (const meshrt::Error&) {  // a clear error is the answer to a bad shape or name
  }
  return 0;
}
