// libFuzzer target: restoring a checkpoint whose files are corrupt (train/checkpoint, train/zarr,
// train/json). A valid checkpoint is saved once: leaf 'w', float32[4, 6] sharded P('x') over 2 of
// 4 cpu devices (chunks c/0/0 and c/1/0, each float32[2, 6] + its crc32c). Each input replaces
// files of it and restores onto one of several shardings. The first byte says what:
//   bits 0-1  the file(s) the rest replaces: 0 w/zarr.json, 1 the chunk w/c/0/0, 2 the step's
//             group zarr.json, 3 w/zarr.json then, after the first NUL byte, w/c/0/0
//   bits 2-3  the target: 0 the saved sharding (chunks read in place), 1 replicated, 2 P(None,
//             'x'), 3 P('x') over 4 devices (chunks scattered into several blocks)
//   bit 4     the chunk w/c/1/0 is removed
// A restore must succeed or throw meshrt::Error: a truncated or corrupted chunk, or metadata that
// asks for a size of its choosing, may never crash or allocate by that size.
#include <ftw.h>
#include <meshrt/meshrt.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

using meshrt::checkpoint::ShapeDtypeStruct;

std::string& dir() {
  static std::string d;
  return d;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The saved files, restored after each input.
struct Saved {
  std::string array_json, group_json, chunk0, chunk1;
};
Saved& saved() {
  static Saved s;
  return s;
}
std::string array_json_path() { return dir() + "/0/w/zarr.json"; }
std::string group_json_path() { return dir() + "/0/zarr.json"; }
std::string chunk_path(int i) { return dir() + "/0/w/c/" + std::to_string(i) + "/0"; }

void remove_dir() {
  if (dir().empty()) return;
  nftw(
      dir().c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("MESHRT_CPU_DEVICES", "4", 1);
  setenv("MESHRT_PLATFORM", "cpu", 1);
  char tmpl[] = "/tmp/meshrt-fuzz-checkpoint-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("fuzz_checkpoint: mkdtemp");
    std::abort();
  }
  dir() = tmpl;
  std::atexit(remove_dir);
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const meshrt::Mesh mesh = meshrt::make_mesh({2}, {"x"});
  std::map<std::string, meshrt::Array> tree{
      {"w", meshrt::device_put(v, {4, 6}, meshrt::NamedSharding(mesh, meshrt::P("x")))}};
  meshrt::checkpoint::save(dir(), tree, 0);
  saved() = {read_file(array_json_path()), read_file(group_json_path()), read_file(chunk_path(0)),
             read_file(chunk_path(1))};
  if (saved().chunk0.empty() || saved().chunk1.empty() || saved().array_json.empty()) {
    std::fprintf(stderr, "fuzz_checkpoint: the checkpoint in %s is not laid out as expected\n",
                 dir().c_str());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t how = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (how & 3) {
    case 0:
      write_file(array_json_path(), rest);
      break;
    case 1:
      write_file(chunk_path(0), rest);
      break;
    case 2:
      write_file(group_json_path(), rest);
      break;
    default: {
      const size_t nul = rest.find('\0');
      write_file(array_json_path(), rest.substr(0, nul));
      write_file(chunk_path(0), nul == std::string_view::npos ? "" : rest.substr(nul + 1));
    }
  }
  if (how & 16) std::remove(chunk_path(1).c_str());
  const meshrt::Mesh mesh2 = meshrt::make_mesh({2}, {"x"});
  const meshrt::Mesh mesh4 = meshrt::make_mesh({4}, {"x"});
  const meshrt::Sharding targets[] = {meshrt::NamedSharding(mesh2, meshrt::P("x")),
                                      meshrt::NamedSharding(mesh2, meshrt::P()),
                                      meshrt::NamedSharding(mesh2, meshrt::P(meshrt::None, "x")),
                                      meshrt::NamedSharding(mesh4, meshrt::P("x"))};
  std::map<std::string, ShapeDtypeStruct> like{
      {"w", {.shape = {4, 6}, .dtype = meshrt::DType::f32, .sharding = targets[(how >> 2) & 3]}}};
  try {
    (void)meshrt::checkpoint::restore(dir(), like, 0);
  } catch (const meshrt::Error&) {  // a clear error is the answer to a corrupt checkpoint
  }
  write_file(array_json_path(), saved().array_json);
  write_file(group_json_path(), saved().group_json);
  write_file(chunk_path(0), saved().chunk0);
  write_file(chunk_path(1), saved().chunk1);
  return 0;
}
