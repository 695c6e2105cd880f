// tests/test_checkpoint.cpp: train/checkpoint.h: round trips bit for bit, restores onto other
// meshes and shardings, latest/keep, async saves, corrupt and truncated files, crash safety
// (a child process killed while saving), a checkpoint written by Python's zarr, bfloat16/float16
// leaves (round trips, casts onto other float dtypes, a checkpoint written by zarr-python and
// tensorstore), CRC-32C vectors.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/detail/access.h"
#include "tests/test_util.h"
#include "train/crc32c.h"

extern char** environ;

namespace meshrt {
namespace {

namespace fs = std::filesystem;
using checkpoint::ShapeDtypeStruct;

struct Params {
  Array w;
  std::vector<Array> layers;
  std::map<std::string, Array> extra;
  int width = 3;  // static: not saved, copied from the target
};
MESHRT_TREE(Params, w, layers, extra, width)

template <class A>
struct Layer {
  A kernel, bias;
  int units = 0;
};
MESHRT_TREE_TEMPLATE(Layer, kernel, bias, units)

// A fresh folder, removed with its contents at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "meshrt_ckpt_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& sub) const { return path_ + "/" + sub; }

 private:
  std::string path_;
};

// Rewrites one byte of a file.
void flip_byte(const std::string& file, std::streamoff at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(at);
  f.write(&c, 1);
}

void write_file(const std::string& file, const std::string& text) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
}

std::string read_file(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Mesh mesh_1d(int n = 8) { return make_mesh({n}, {"x"}); }
Mesh mesh_2d() { return make_mesh({4, 2}, {"a", "b"}); }

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Every block's bytes and its device, for bit-for-bit comparisons.
struct Blocks {
  std::vector<std::vector<unsigned char>> bytes;
  std::vector<int> devices;
  bool operator==(const Blocks&) const = default;
};
Blocks blocks_of(const Array& a) {
  Blocks b;
  for (const Tensor& t : detail::ArrayAccess::blocks(a)) {
    b.bytes.push_back(test::host_bytes(t));
    b.devices.push_back(t.device().id());
  }
  return b;
}

void expect_same(const Array& got, const Array& want, const std::string& what) {
  EXPECT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  EXPECT_TRUE(got.sharding() == want.sharding())
      << what << ": " << got.sharding().str() << " vs " << want.sharding().str();
  EXPECT_TRUE(blocks_of(got) == blocks_of(want)) << what << ": blocks differ";
}

// A tree over many shardings and every dtype, with bits that a float round trip could lose.
Params make_params(uint32_t seed) {
  Mesh m1 = mesh_1d();
  Mesh m2 = mesh_2d();
  std::vector<float> w = random_floats(64 * 16, seed);
  w[0] = -0.0f;
  w[1] = std::numeric_limits<float>::quiet_NaN();
  w[2] = std::numeric_limits<float>::infinity();
  w[3] = std::numeric_limits<float>::denorm_min();
  uint32_t payload = 0x7fa12345u;  // a NaN with a payload
  std::memcpy(&w[4], &payload, 4);
  Params p;
  p.w = device_put(w, {64, 16}, NamedSharding(m1, P("x")));
  p.layers.push_back(
      device_put(random_floats(16 * 8, seed + 1), {16, 8}, NamedSharding(m2, P("a", "b"))));
  std::vector<double> d(40);
  for (size_t i = 0; i < d.size(); ++i) d[i] = 1.0 / (static_cast<double>(i) + 3.0);
  p.layers.push_back(device_put(d, {5, 8}, NamedSharding(m1, P(None, "x"))));
  std::vector<int32_t> ids(24);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 7919 - 50000 + seed);
  p.layers.push_back(device_put(ids, {4, 6}, NamedSharding(m2, P("a"))));  // replicated over b
  p.extra["count"] = device_put(std::vector<int64_t>{int64_t{1} << 40 | seed}, {},
                                NamedSharding(m1, P()));  // rank 0, replicated
  std::vector<bool> mask(16);
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 5 + seed) % 3 == 0;
  p.extra["mask"] = device_put(mask, {16}, NamedSharding(m1, P("x")));
  p.extra["single"] =
      device_put(random_floats(10, seed + 2), {10}, SingleDeviceSharding(devices()[3]));
  p.extra["empty"] = device_put(std::vector<float>{}, {0, 4}, NamedSharding(m1, P("x")));
  p.width = 11;
  return p;
}

void expect_same_params(const Params& got, const Params& want) {
  expect_same(got.w, want.w, "w");
  ASSERT_EQ(got.layers.size(), want.layers.size());
  for (size_t i = 0; i < got.layers.size(); ++i) {
    expect_same(got.layers[i], want.layers[i], "layers[" + std::to_string(i) + "]");
  }
  ASSERT_EQ(got.extra.size(), want.extra.size());
  for (const auto& [k, v] : want.extra) expect_same(got.extra.at(k), v, "extra['" + k + "']");
}

TEST(Checkpoint, RoundTripBitForBit) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  Params p = make_params(1);
  checkpoint::save(dir.path(), p, 5, {.metadata = {{"run", "alpha"}, {"lr", "0.001"}}});
  EXPECT_EQ(checkpoint::latest(dir.path()), 5);
  Params like = make_params(2);  // other values, same structure and shardings
  like.width = 99;
  Params r = checkpoint::restore(dir.path(), like);
  expect_same_params(r, p);
  EXPECT_EQ(r.width, 99);  // static fields come from the target
  EXPECT_EQ(checkpoint::metadata(dir.path(), 5),
            (std::map<std::string, std::string>{{"run", "alpha"}, {"lr", "0.001"}}));

  // The layout: a group per step, one array per leaf at its tree path, chunks = blocks.
  const std::string s = dir / "5";
  for (const char* f : {"zarr.json", "w/zarr.json", "layers/zarr.json", "layers/0/zarr.json",
                        "extra/zarr.json", "extra/count/zarr.json", "extra/count/c", "w/c/7/0",
                        "layers/0/c/3/1", "layers/1/c/0/7", "extra/mask/c/7", "extra/single/c/0"}) {
    EXPECT_TRUE(fs::exists(s + "/" + f)) << f;
  }
  // layers[2] is replicated over 'b': each block written once (4 chunks of (1, 6)).
  int chunks = 0;
  for (const auto& e : fs::recursive_directory_iterator(s + "/layers/2/c"))
    chunks += e.is_regular_file();
  EXPECT_EQ(chunks, 4);
  // A chunk is the block's little-endian bytes and a 4-byte checksum.
  EXPECT_EQ(fs::file_size(s + "/w/c/0/0"), 8u * 16 * 4 + 4);
  const std::string meta = read_file(s + "/w/zarr.json");
  for (const char* frag :
       {"\"node_type\": \"array\"", "\"data_type\": \"float32\"", "\"name\": \"crc32c\"",
        "\"endian\": \"little\"", "\"separator\": \"/\""}) {
    EXPECT_NE(meta.find(frag), std::string::npos) << frag << " in " << meta;
  }
}

TEST(Checkpoint, SingleArrayAndTensorLeaves) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  Array a = device_put(random_floats(32, 9), {8, 4}, NamedSharding(mesh_1d(), P("x")));
  checkpoint::save(dir.path(), a, 0);
  EXPECT_TRUE(fs::exists(dir / "0/value/zarr.json"));
  expect_same(checkpoint::restore(dir.path(), a), a, "one Array");

  Tensor t = tensor(random_floats(6, 4), {2, 3}, devices()[5]);
  std::pair<Tensor, Array> tree{t, a};
  checkpoint::save(dir.path(), tree, 1);
  auto r = checkpoint::restore(dir.path(), tree);
  EXPECT_EQ(r.first.device(), devices()[5]);
  EXPECT_EQ(test::host_bytes(r.first), test::host_bytes(t));
  expect_same(r.second, a, "pair.second");
}

TEST(Checkpoint, RestoreOntoOtherMeshesAndShardings) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  std::vector<float> host = random_floats(16 * 8, 3);
  // FSDP over 8 devices.
  Array w = device_put(host, {16, 8}, NamedSharding(mesh_1d(), P("x")));
  std::map<std::string, Array> tree{{"w", w}};
  checkpoint::save(dir.path(), tree, 1);

  const std::vector<std::pair<std::string, Sharding>> targets = {
      {"4x2 P(a, b)", NamedSharding(mesh_2d(), P("a", "b"))},
      {"4x2 P(b, a)", NamedSharding(mesh_2d(), P("b", "a"))},
      {"4x2 P(None, b)", NamedSharding(mesh_2d(), P(None, "b"))},
      {"replicated", NamedSharding(mesh_1d(), P())},
      {"2 devices P(x)", NamedSharding(mesh_1d(2), P("x"))},
      {"8 devices P(None, x)", NamedSharding(mesh_1d(), P(None, "x"))},
      {"one device", SingleDeviceSharding(devices()[6])},
  };
  for (const auto& [name, sharding] : targets) {
    std::map<std::string, ShapeDtypeStruct> like{
        {"w", {.shape = {16, 8}, .dtype = DType::f32, .sharding = sharding}}};
    std::map<std::string, Array> r = checkpoint::restore(dir.path(), like);
    const Array& got = r.at("w");
    EXPECT_TRUE(got.sharding() == sharding) << name;
    EXPECT_EQ(got.to_vector<float>(), host) << name;
    // Each block is the host value's box (an independent slice of `host`).
    auto map = sharding.devices_indices_map({16, 8});
    for (size_t i = 0; i < map.size(); ++i) {
      const Index& idx = map[i].second;
      std::vector<float> want;
      for (int64_t r0 = idx[0].first; r0 < idx[0].second; ++r0) {
        for (int64_t c = idx[1].first; c < idx[1].second; ++c) want.push_back(host[r0 * 8 + c]);
      }
      EXPECT_EQ(detail::ArrayAccess::blocks(got)[i].to_vector<float>(), want)
          << name << " block " << i;
      EXPECT_EQ(detail::ArrayAccess::blocks(got)[i].device(), map[i].first) << name;
    }
  }

  // A template struct of ShapeDtypeStructs restores as the same template of Arrays.
  Layer<Array> layer{w, device_put(random_floats(8, 5), {8}, NamedSharding(mesh_1d(), P())), 4};
  checkpoint::save(dir.path(), layer, 2);
  Layer<ShapeDtypeStruct> target{{{16, 8}, DType::f32, NamedSharding(mesh_2d(), P(None, "a"))},
                                 {{8}, DType::f32, NamedSharding(mesh_2d(), P("a"))},
                                 7};
  Layer<Array> got = checkpoint::restore(dir.path(), target, 2);
  EXPECT_EQ(got.units, 7);
  EXPECT_EQ(got.kernel.to_vector<float>(), host);
  EXPECT_EQ(got.bias.to_vector<float>(), layer.bias.to_vector<float>());
  EXPECT_TRUE(got.kernel.sharding() == NamedSharding(mesh_2d(), P(None, "a")));
}

// A chunk whose rows are larger than the reader's 8 MiB pieces, scattered into two blocks: the
// reader splits each row (its buffer is never sized by the metadata's chunk shape).
TEST(Checkpoint, RestoreChunkWithRowsAbovePieceSize) {
  if (auto why = test::too_few_devices(2); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const int64_t cols = (int64_t{1} << 21) + 8;  // float32: 8 MiB and 32 B per row
  std::vector<float> host(static_cast<size_t>(2 * cols));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 100003);
  std::map<std::string, Array> tree{
      {"w", device_put(host, {2, cols}, NamedSharding(mesh_1d(2), P()))}};
  checkpoint::save(dir.path(), tree, 0);
  const Sharding to = NamedSharding(mesh_1d(2), P(None, "x"));
  std::map<std::string, ShapeDtypeStruct> like{
      {"w", {.shape = {2, cols}, .dtype = DType::f32, .sharding = to}}};
  const Array got = checkpoint::restore(dir.path(), like).at("w");
  EXPECT_EQ(got.to_vector<float>(), host);
  flip_byte(dir / "0/w/c/0/0", (int64_t{1} << 23) + 40);  // in the second piece of row 0
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), like), "chunk c/0/0", "crc32c");
}

TEST(Checkpoint, LatestKeepAndSteps) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  EXPECT_EQ(checkpoint::latest(dir / "missing"), std::nullopt);
  EXPECT_EQ(checkpoint::latest(dir.path()), std::nullopt);
  std::vector<Array> tree{device_put(random_floats(8, 1), {8}, NamedSharding(mesh_1d(), P("x")))};
  for (int64_t s : {1, 2, 3, 10, 20}) checkpoint::save(dir.path(), tree, s, {.keep = 3});
  EXPECT_EQ(checkpoint::all_steps(dir.path()), (std::vector<int64_t>{3, 10, 20}));
  EXPECT_EQ(checkpoint::latest(dir.path()), 20);
  // An older step saved later is kept itself, with the 3 newest.
  checkpoint::save(dir.path(), tree, 4, {.keep = 3});
  EXPECT_EQ(checkpoint::all_steps(dir.path()), (std::vector<int64_t>{4, 10, 20}));
  checkpoint::save(dir.path(), tree, 21);
  EXPECT_EQ(checkpoint::all_steps(dir.path()), (std::vector<int64_t>{4, 10, 20, 21}));
  // Leftovers that are not complete steps are never seen.
  fs::create_directories(dir / "30.tmp-deadbeef/w");
  fs::create_directories(dir / "40");  // no zarr.json
  fs::create_directories(dir / "0050");
  EXPECT_EQ(checkpoint::latest(dir.path()), 21);
  // restore() defaults to the latest step; an explicit step is honoured.
  std::vector<Array> other{device_put(random_floats(8, 2), {8}, NamedSharding(mesh_1d(), P("x")))};
  checkpoint::save(dir.path(), other, 22);
  EXPECT_EQ(checkpoint::restore(dir.path(), tree)[0].to_vector<float>(),
            other[0].to_vector<float>());
  EXPECT_EQ(checkpoint::restore(dir.path(), tree, 21)[0].to_vector<float>(),
            tree[0].to_vector<float>());
  // A successful save removes crashed saves' folders.
  EXPECT_FALSE(fs::exists(dir / "30.tmp-deadbeef"));
}

TEST(Checkpoint, AsyncSaveThenWait) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  Params p = make_params(7);
  checkpoint::save(dir.path(), p, 1, {.async = true});
  checkpoint::wait_until_finished();
  EXPECT_EQ(checkpoint::latest(dir.path()), 1);
  expect_same_params(checkpoint::restore(dir.path(), p, 1), p);

  // The next save joins the one in flight; restore joins too.
  Params q = make_params(8);
  checkpoint::save(dir.path(), p, 2, {.async = true});
  checkpoint::save(dir.path(), q, 3, {.async = true, .keep = 2});
  expect_same_params(checkpoint::restore(dir.path(), q), q);
  EXPECT_EQ(checkpoint::all_steps(dir.path()), (std::vector<int64_t>{2, 3}));

  // A failure of the background write is raised at the join, once.
  checkpoint::save(dir.path(), p, 3, {.async = true});  // step 3 exists
  EXPECT_MESHRT_ERROR(checkpoint::wait_until_finished(), "[checkpoint]", "exists already");
  checkpoint::wait_until_finished();
  checkpoint::save(dir.path(), p, 2, {.async = true});
  EXPECT_MESHRT_ERROR(checkpoint::save(dir.path(), p, 9), "exists already");
  checkpoint::save(dir.path(), p, 9);  // the error was raised once
  EXPECT_EQ(checkpoint::latest(dir.path()), 9);
}

TEST(Checkpoint, ParamsWithAdamStateResumeOnAnotherMesh) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  using Train = std::pair<std::map<std::string, Array>, optim::State<std::map<std::string, Array>>>;
  std::map<std::string, Array> params{
      {"w", device_put(random_floats(32 * 8, 21), {32, 8}, NamedSharding(mesh_1d(), P("x")))},
      {"b", device_put(random_floats(8, 22), {8}, NamedSharding(mesh_1d(), P()))}};
  auto opt = optim::adam(1e-2);
  auto state = opt.init(params);
  std::map<std::string, Array> grads{
      {"w", device_put(random_floats(32 * 8, 23), {32, 8}, NamedSharding(mesh_1d(), P("x")))},
      {"b", device_put(random_floats(8, 24), {8}, NamedSharding(mesh_1d(), P()))}};
  auto [updates, next] = opt.update(grads, state, params);
  Train saved{optim::apply_updates(params, updates), next};
  checkpoint::save(dir.path(), saved, 1);
  // Resume with the same structure on a 4x2 mesh (FSDP -> 2-D), as a fresh run would build it.
  Mesh m = mesh_2d();
  std::map<std::string, Array> fresh{
      {"w", device_put(std::vector<float>(32 * 8), {32, 8}, NamedSharding(m, P("a", "b")))},
      {"b", device_put(std::vector<float>(8), {8}, NamedSharding(m, P()))}};
  Train like{fresh, opt.init(fresh)};
  Train r = checkpoint::restore(dir.path(), like);
  std::vector<Array> got = tree_leaves(r), want = tree_leaves(saved);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].dtype(), want[i].dtype());
    EXPECT_EQ(test::host_bytes(process_allgather(got[i])),
              test::host_bytes(process_allgather(want[i])))
        << "leaf " << i;
  }
  EXPECT_TRUE(r.first.at("w").sharding() == NamedSharding(m, P("a", "b")));
  EXPECT_EQ(r.second.count().to_vector<int32_t>(), std::vector<int32_t>{1});
}

TEST(Checkpoint, CorruptAndTruncatedFiles) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  Params p = make_params(4);
  auto fresh = [&](int64_t step) {
    checkpoint::save(dir.path(), p, step);
    return dir / std::to_string(step);
  };
  std::string s = fresh(1);
  flip_byte(s + "/w/c/3/0", 100);
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 1), "[checkpoint]", "leaf 'w' (tree.w)",
                      "chunk c/3/0", "crc32c", "restore another step");
  s = fresh(2);
  flip_byte(s + "/layers/0/c/1/0", 0);  // the checksum covers every byte
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 2), "leaf 'layers/0' (tree.layers[0])",
                      "chunk c/1/0", "crc32c");
  s = fresh(3);
  fs::resize_file(s + "/extra/mask/c/7", 1);
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 3), "leaf 'extra/mask'", "chunk c/7",
                      "has 1 bytes where its encoding has 6", "truncated");
  s = fresh(4);
  fs::remove(s + "/extra/count/c");
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 4), "leaf 'extra/count'", "chunk c",
                      "incomplete");
  s = fresh(5);
  write_file(s + "/zarr.json", "{\"zarr_format\": 3, \"node_type\": \"gro");
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 5), "[checkpoint]", "zarr.json",
                      "not valid JSON");
  s = fresh(6);
  std::string group = read_file(s + "/zarr.json");
  group.replace(group.find("\"format_version\": 1"), 19, "\"format_version\": 99");
  write_file(s + "/zarr.json", group);
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 6), "format version 99", "reads version 1",
                      "newer meshrt");
  // Sizes in the metadata are never trusted for allocation: a huge chunk shape is refused.
  s = fresh(7);
  std::string w = read_file(s + "/w/zarr.json");
  const size_t at = w.find("\"chunk_shape\"");
  const size_t open = w.find('[', at), close = w.find(']', at);
  write_file(s + "/w/zarr.json", w.substr(0, open) + "[4611686018427387904, 4611686018427387904]" +
                                     w.substr(close + 1));
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 7), "leaf 'w'", "too large");
  s = fresh(8);
  write_file(s + "/w/zarr.json", w.substr(0, open) + "[8, 16]" + w.substr(close + 1));
  fs::resize_file(s + "/w/c/0/0", 1u << 20);  // the chunk is not what the metadata says
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 8), "leaf 'w'", "chunk c/0/0",
                      "truncated or corrupt");
  // An unreadable chunk never crashes: an empty file, a chunk of garbage.
  s = fresh(9);
  fs::resize_file(s + "/layers/1/c/0/3", 0);
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 9), "chunk c/0/3", "has 0 bytes");
}

TEST(Checkpoint, ClearErrors) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  Params p = make_params(5);
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir / "nope", p), "[checkpoint]", "nope",
                      "does not exist");
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p), "holds no complete checkpoint");
  checkpoint::save(dir.path(), p, 3);
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), p, 4), "step 4 is not in",
                      "complete steps: 3");
  EXPECT_MESHRT_ERROR(checkpoint::save(dir.path(), p, 3), "exists already");
  EXPECT_MESHRT_ERROR(checkpoint::save(dir.path(), p, -1), "negative");

  // Tree mismatches name the path.
  Params more = p;
  more.layers.push_back(p.w);
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), more), "tree mismatch at tree.layers[3]",
                      "no leaf 'layers/3'");
  Params fewer = p;
  fewer.extra.erase("mask");
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), fewer), "tree mismatch at tree.extra['mask']",
                      "target tree has no such leaf");
  // Shape and dtype mismatches.
  Params shape = p;
  shape.w = device_put(random_floats(32 * 16, 1), {32, 16}, NamedSharding(mesh_1d(), P("x")));
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), shape), "leaf 'w' (tree.w)",
                      "holds float32(64, 16)", "target is float32(32, 16)");
  Params dtype = p;
  dtype.layers[2] = device_put(std::vector<int64_t>(24), {4, 6}, NamedSharding(mesh_2d(), P("a")));
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), dtype), "tree.layers[2]", "holds int32",
                      "target is int64");
  std::map<std::string, ShapeDtypeStruct> unsharded{{"w", {.shape = {64, 16}}}};
  std::map<std::string, Array> w_only{{"w", p.w}};
  checkpoint::save(dir.path(), w_only, 4);
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), unsharded), "tree['w']", "no sharding");
  std::map<std::string, ShapeDtypeStruct> uneven{
      {"w", {.shape = {64, 16}, .sharding = NamedSharding(mesh_1d(), P(None, None, "x"))}}};
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), uneven), "[checkpoint]", "tree['w']");
  // Map keys must be Zarr node names.
  std::map<std::string, Array> bad{{"a/b", p.w}};
  EXPECT_MESHRT_ERROR(checkpoint::save(dir.path(), bad, 9), "tree['a/b']",
                      "cannot name a Zarr node");
  std::map<std::string, Array> dots{{"..", p.w}};
  EXPECT_MESHRT_ERROR(checkpoint::save(dir.path(), dots, 9), "cannot name a Zarr node");
  EXPECT_FALSE(fs::exists(dir / "9"));
}

// ---- crash safety: a child process saves step 2 and is killed at a random moment.

// The child: runs only when the crash test starts this binary with MESHRT_CKPT_CRASH_DIR.
Params crash_tree(uint32_t seed) {
  Params p = make_params(seed);
  Mesh m = mesh_1d();
  for (int i = 0; i < 6; ++i) {  // ~3 MiB in 48 more chunks: a save takes a while
    p.extra["big" + std::to_string(i)] =
        device_put(random_floats(256 * 512, seed + 10 + i), {256, 512}, NamedSharding(m, P("x")));
  }
  return p;
}

TEST(CheckpointCrash, Child) {
  const char* dir = std::getenv("MESHRT_CKPT_CRASH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "the crash test's child: runs only when that test starts it";
  Params p = crash_tree(2);
  const char ready = 'R';
  ASSERT_EQ(::write(3, &ready, 1), 1);  // the parent starts its clock here
  checkpoint::save(dir, p, 2);
  const char done = 'D';
  ASSERT_EQ(::write(3, &done, 1), 1);
}

TEST(CheckpointCrash, KilledSaveLeavesPreviousStepIntact) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const Params p1 = crash_tree(1);
  const Params p2 = crash_tree(2);
  checkpoint::save(dir.path(), p1, 1);
  // How long a save of step 2 takes here: the kills land anywhere in 0 .. 1.5x that.
  TempDir scratch;
  auto t0 = std::chrono::steady_clock::now();
  checkpoint::save(scratch.path(), p2, 2);
  const double save_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  std::mt19937 gen(1234);
  std::uniform_real_distribution<double> delay(0.0, 1.5 * save_us);
  int completed = 0, interrupted = 0;
  const int trials = 30;
  for (int trial = 0; trial < trials; ++trial) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 3);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
    env_s.push_back("MESHRT_CKPT_CRASH_DIR=" + dir.path());
    std::vector<char*> env;
    for (auto& e : env_s) env.push_back(e.data());
    env.push_back(nullptr);
    std::string exe = fs::read_symlink("/proc/self/exe").string();
    std::string filter = "--gtest_filter=CheckpointCrash.Child";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, env.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    char c = 0;
    ASSERT_EQ(::read(fds[0], &c, 1), 1) << "the child did not start";
    ASSERT_EQ(c, 'R');
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(delay(gen))));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(fds[0]);

    // Never a partial step: either step 2 is complete and whole, or it is not there.
    const std::optional<int64_t> latest = checkpoint::latest(dir.path());
    ASSERT_TRUE(latest == 1 || latest == 2) << "trial " << trial;
    if (latest == 2) {
      ++completed;
      expect_same_params(checkpoint::restore(dir.path(), p2, 2), p2);
      fs::remove_all(dir / "2");
    } else {
      ++interrupted;
    }
    expect_same_params(checkpoint::restore(dir.path(), p1, 1), p1);
    if (HasFailure()) break;
  }
  std::printf("crash trials: %d killed mid-save, %d completed (save takes %.1f ms)\n", interrupted,
              completed, save_us / 1000);
  EXPECT_GT(interrupted, 0) << "no kill landed inside a save";
  // The next save succeeds and removes the killed saves' temporary folders.
  checkpoint::save(dir.path(), p2, 2);
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
  expect_same_params(checkpoint::restore(dir.path(), p2), p2);
}

// ---- a checkpoint written by Python's zarr (tests/data/gen_checkpoint.py)

struct PyTree {
  std::map<std::string, Array> params;
  std::vector<Array> layers;
  Array step_count, mask;
};
MESHRT_TREE(PyTree, params, layers, step_count, mask)

TEST(Checkpoint, ReadsWhatZarrPythonWrote) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = test::test_data_dir() + "/zarr_ckpt";
  ASSERT_EQ(checkpoint::latest(dir), 7);
  EXPECT_EQ(checkpoint::metadata(dir).at("writer").rfind("zarr-python 3.", 0), 0u);
  // Targets that cut across the chunks Python chose (2x3, 4 with an edge chunk, 2x4, ...).
  Mesh m4 = mesh_1d(4), m2 = mesh_1d(2), m8 = mesh_1d();
  PyTree like;
  like.params["W"] = device_put(std::vector<float>(24), {4, 6}, NamedSharding(m4, P("x")));
  like.params["b"] = device_put(std::vector<double>(6), {6}, NamedSharding(m2, P("x")));
  like.layers.push_back(
      device_put(std::vector<int32_t>(12), {3, 4}, NamedSharding(m2, P(None, "x"))));
  like.layers.push_back(device_put(std::vector<int64_t>(8), {8}, NamedSharding(m8, P("x"))));
  like.step_count = device_put(std::vector<int64_t>{0}, {}, NamedSharding(m8, P()));
  like.mask = device_put(std::vector<bool>(5), {5}, SingleDeviceSharding(devices()[2]));
  PyTree r = checkpoint::restore(dir, like);
  // The generator's formulas, written out here.
  std::vector<float> w(24);
  for (int i = 0; i < 24; ++i) w[i] = static_cast<float>(i % 17) * 0.25f - 2.0f;
  EXPECT_EQ(r.params.at("W").to_vector<float>(), w);
  EXPECT_EQ(r.params.at("b").to_vector<double>(),
            (std::vector<double>{-1.25, -0.75, -0.25, 0.25, 0.75, 1.25}));
  std::vector<int32_t> ids(12);
  for (int i = 0; i < 12; ++i) ids[i] = i * 3 - 7;
  EXPECT_EQ(r.layers[0].to_vector<int32_t>(), ids);
  // Chunk 2 (elements 4, 5) equals the fill value: zarr-python did not write it.
  EXPECT_FALSE(fs::exists(dir + "/7/layers/1/c/2"));
  EXPECT_EQ(r.layers[1].to_vector<int64_t>(), (std::vector<int64_t>{-7, -4, -1, 2, 0, 0, 11, 14}));
  EXPECT_EQ(r.step_count.to_vector<int64_t>(), std::vector<int64_t>{7});
  EXPECT_EQ(r.mask.to_vector<bool>(), (std::vector<bool>{true, false, false, true, false}));
  EXPECT_TRUE(r.layers[0].sharding() == NamedSharding(m2, P(None, "x")));
}

// ---- bfloat16 and float16 leaves.

template <class H>
std::vector<H> from_bits(const std::vector<uint16_t>& bits) {
  std::vector<H> out;
  for (uint16_t b : bits) out.push_back(H::from_bits(b));
  return out;
}
template <class H>
std::vector<uint16_t> bits_of(const std::vector<H>& v) {
  std::vector<uint16_t> out;
  for (H h : v) out.push_back(h.bits());
  return out;
}
// Corner bits (zeros, infinities, NaNs with and without payload, the smallest and largest
// subnormals), then spread patterns.
std::vector<uint16_t> lowp_bits(size_t n, std::vector<uint16_t> specials, uint16_t stride) {
  for (size_t i = specials.size(); i < n; ++i) {
    specials.push_back(static_cast<uint16_t>(0x3000 + stride * i));
  }
  return specials;
}

TEST(Checkpoint, LowPrecisionRoundTripBitForBit) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const auto bf = lowp_bits(64 * 8,
                            {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc1, 0x0001, 0x007f,
                             0x8001, 0x3f80, 0x3f81},
                            97);
  const auto hf = lowp_bits(
      12 * 4, {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x0001, 0x03ff, 0x7bff, 0xfbff}, 53);
  std::map<std::string, Array> tree{
      {"bf", device_put(from_bits<bfloat16>(bf), {64, 8}, NamedSharding(mesh_2d(), P("a", "b")))},
      {"hf", device_put(from_bits<float16>(hf), {12, 4}, NamedSharding(mesh_1d(4), P("x")))},
      {"scalar",
       device_put(std::vector<bfloat16>{bfloat16(-2.5f)}, {}, NamedSharding(mesh_1d(), P()))},
  };
  checkpoint::save(dir.path(), tree, 1);
  const std::string s = dir / "1";
  EXPECT_NE(read_file(s + "/bf/zarr.json").find("\"data_type\": \"bfloat16\""), std::string::npos);
  EXPECT_NE(read_file(s + "/hf/zarr.json").find("\"data_type\": \"float16\""), std::string::npos);
  EXPECT_EQ(fs::file_size(s + "/bf/c/0/0"), 16u * 4 * 2 + 4);  // 2 bytes an element + CRC-32C
  std::map<std::string, Array> r = checkpoint::restore(dir.path(), tree);
  for (const auto& [k, v] : tree) expect_same(r.at(k), v, k);
  EXPECT_EQ(bits_of(r.at("bf").to_vector<bfloat16>()), bf);
  EXPECT_EQ(bits_of(r.at("hf").to_vector<float16>()), hf);
  // Onto other shardings.
  std::map<std::string, ShapeDtypeStruct> other{
      {"bf", {{64, 8}, DType::bf16, NamedSharding(mesh_1d(), P(None, "x"))}},
      {"hf", {{12, 4}, DType::f16, SingleDeviceSharding(devices()[5])}},
      {"scalar", {{}, DType::bf16, NamedSharding(mesh_2d(), P())}},
  };
  std::map<std::string, Array> o = checkpoint::restore(dir.path(), other);
  EXPECT_EQ(bits_of(o.at("bf").to_vector<bfloat16>()), bf);
  EXPECT_EQ(bits_of(o.at("hf").to_vector<float16>()), hf);
  EXPECT_EQ(static_cast<float>(o.at("scalar").item<bfloat16>()), -2.5f);
  EXPECT_TRUE(o.at("bf").sharding() == NamedSharding(mesh_1d(), P(None, "x")));
  // A 16-bit float leaf restores onto another float dtype (as orbax casts); not onto an integer.
  std::map<std::string, ShapeDtypeStruct> wide{
      {"bf", {{64, 8}, DType::f32, NamedSharding(mesh_1d(), P("x"))}},
      {"hf", {{12, 4}, DType::f64, NamedSharding(mesh_1d(4), P("x"))}},
      {"scalar", {{}, DType::f32, NamedSharding(mesh_2d(), P())}},
  };
  std::map<std::string, Array> w = checkpoint::restore(dir.path(), wide);
  EXPECT_EQ(w.at("bf").dtype(), DType::f32);
  const std::vector<float> bf_f32 = w.at("bf").to_vector<float>();
  for (size_t i = 0; i < bf.size(); ++i) {  // bfloat16 is float32's upper 16 bits
    uint32_t u = 0;
    std::memcpy(&u, &bf_f32[i], 4);
    if ((bf[i] & 0x7f80) == 0x7f80 && (bf[i] & 0x7f) != 0) {
      EXPECT_TRUE(std::isnan(bf_f32[i])) << i;
    } else {
      EXPECT_EQ(u, uint32_t{bf[i]} << 16) << i;
    }
  }
  EXPECT_EQ(w.at("hf").to_vector<double>()[8], 65504.0);
  EXPECT_EQ(w.at("hf").to_vector<double>()[7], 1023.0 / (1 << 24));  // largest subnormal
  std::map<std::string, ShapeDtypeStruct> ints = other;
  ints.at("hf").dtype = DType::i32;
  EXPECT_MESHRT_ERROR(checkpoint::restore(dir.path(), ints), "tree['hf']", "holds float16",
                      "target is int32");
}

// A checkpoint written by Python (tests/data/gen_checkpoint.py): float16 by zarr-python, bfloat16
// by tensorstore, and a float32 leaf restored onto bf16/f16 targets against tensorstore's casts.
TEST(Checkpoint, ReadsLowPrecisionPythonWrote) {
  if (auto why = test::too_few_devices(8); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = test::test_data_dir() + "/zarr_ckpt_lowp";
  ASSERT_EQ(checkpoint::latest(dir), 3);
  const auto meta = checkpoint::metadata(dir);
  EXPECT_NE(meta.at("writer").find("tensorstore"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/3/bf16/c/0/2"));  // two chunks along dim 1: 0 and 1
  // The generator's formulas, written out here.
  std::vector<uint16_t> bf{0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x3F80, 0x3F81};
  for (int i = 8; i < 24; ++i) bf.push_back(static_cast<uint16_t>(0x3C00 + 37 * i));
  std::vector<uint16_t> hf{0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x7BFF};
  for (int i = 8; i < 10; ++i) hf.push_back(static_cast<uint16_t>(0x3C00 + 101 * i));
  auto parse_bits = [](const std::string& text) {
    std::vector<uint16_t> out;
    std::istringstream in(text);
    for (std::string w; in >> w;) out.push_back(static_cast<uint16_t>(std::stoul(w, nullptr, 16)));
    return out;
  };
  const std::vector<uint16_t> cast_bf16 = parse_bits(meta.at("cast_bf16"));
  const std::vector<uint16_t> cast_f16 = parse_bits(meta.at("cast_f16"));
  ASSERT_EQ(cast_bf16.size(), 8u);
  ASSERT_EQ(cast_f16.size(), 8u);

  // Targets that cut across Python's chunks ((2, 3), 4 with an edge chunk, 3 with one).
  std::map<std::string, ShapeDtypeStruct> like{
      {"bf16", {{4, 6}, DType::bf16, NamedSharding(mesh_2d(), P("a", "b"))}},
      {"f16", {{10}, DType::f16, NamedSharding(mesh_1d(2), P("x"))}},
      {"master", {{8}, DType::bf16, NamedSharding(mesh_1d(), P("x"))}},
  };
  std::map<std::string, Array> r = checkpoint::restore(dir, like);
  EXPECT_EQ(bits_of(r.at("bf16").to_vector<bfloat16>()), bf);
  EXPECT_EQ(bits_of(r.at("f16").to_vector<float16>()), hf);
  EXPECT_EQ(r.at("master").dtype(), DType::bf16);
  EXPECT_EQ(bits_of(r.at("master").to_vector<bfloat16>()), cast_bf16);
  like.at("master").dtype = DType::f16;
  like.at("master").sharding = NamedSharding(mesh_2d(), P("a"));
  EXPECT_EQ(bits_of(checkpoint::restore(dir, like).at("master").to_vector<float16>()), cast_f16);
}

// ---- CRC-32C against published vectors (RFC 3720 B.4; the "123456789" check value).

TEST(Crc32c, KnownVectors) {
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  // An iSCSI SCSI Read (10) command PDU (RFC 3720 B.4).
  const unsigned char pdu[48] = {0x01, 0xc0, 0, 0, 0, 0, 0,    0, 0,    0, 0, 0,    0, 0, 0, 0,
                                 0x14, 0,    0, 0, 0, 0, 0x04, 0, 0,    0, 0, 0x14, 0, 0, 0, 0x18,
                                 0x28, 0,    0, 0, 0, 0, 0,    0, 0x02, 0, 0, 0,    0, 0, 0, 0};
  for (auto fn : {&detail::crc32c, &detail::crc32c_sw, &detail::crc32c_hw}) {
    EXPECT_EQ(fn("123456789", 9, 0), 0xE3069283u);
    EXPECT_EQ(fn(zeros.data(), 32, 0), 0x8A9136AAu);
    EXPECT_EQ(fn(ones.data(), 32, 0), 0x62A8AB43u);
    EXPECT_EQ(fn(up.data(), 32, 0), 0x46DD794Eu);
    EXPECT_EQ(fn(down.data(), 32, 0), 0x113FDB5Cu);
    EXPECT_EQ(fn(pdu, 48, 0), 0xD9963A56u);
    EXPECT_EQ(fn(nullptr, 0, 0), 0u);
  }
  // Any split and alignment: the table form and the instruction form agree, and continue.
  std::mt19937 gen(5);
  std::vector<unsigned char> data(300);
  for (auto& b : data) b = static_cast<unsigned char>(gen());
  for (size_t off = 0; off < 9; ++off) {
    for (size_t n = 0; n + off <= data.size(); n += 7) {
      const uint32_t sw = detail::crc32c_sw(data.data() + off, n);
      EXPECT_EQ(detail::crc32c_hw(data.data() + off, n), sw);
      const size_t half = n / 3;
      EXPECT_EQ(detail::crc32c(data.data() + off + half, n - half,
                               detail::crc32c(data.data() + off, half)),
                sw);
    }
  }
}

}  // namespace
}  // namespace meshrt
