// bench/checkpoint_report.cpp: checkpoint save and restore speed against the disk's own rate.
//
//   checkpoint_report [--mib 1024] [--dir /tmp] [--reps 3]
//   checkpoint_report --interop DIR   # a small checkpoint for tests/data/gen_checkpoint.py --read
//
// One f32 Array of --mib MiB sharded P('x') over 8 cpu devices (8 chunks). Measured in the same
// run: a dd-style baseline (one file written sequentially in 64 MiB writes + fsync; read back with
// the page cache dropped for it), save (synchronous: durable on return), restore onto the same
// sharding and onto P(None, 'x') (every chunk split over 8 devices) with the checkpoint's pages
// dropped first, and an async save's blocking time. Medians of --reps.
#include <fcntl.h>
#include <meshrt/meshrt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace meshrt;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "checkpoint_report: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Evicts a file's (clean) pages, so the next read comes from the disk.
void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
void drop_tree_cache(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) drop_cache(e.path().string());
  }
}

// dd if=/dev/zero of=file bs=64M count=N conv=fsync, from `buf`.
double baseline_write(const std::string& file, const std::vector<char>& buf) {
  fs::remove(file);
  const double t0 = now_s();
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("open " + file);
  const size_t piece = size_t{64} << 20;
  for (size_t at = 0; at < buf.size();) {
    ssize_t n = ::write(fd, buf.data() + at, std::min(piece, buf.size() - at));
    if (n <= 0) die("write " + file);
    at += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) die("fsync " + file);
  ::close(fd);
  return now_s() - t0;
}

// dd if=file of=/dev/null bs=64M, into `buf`, after dropping the file's pages.
double baseline_read(const std::string& file, std::vector<char>& buf) {
  drop_cache(file);
  const double t0 = now_s();
  int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) die("open " + file);
  const size_t piece = size_t{64} << 20;
  for (size_t at = 0; at < buf.size();) {
    ssize_t n = ::read(fd, buf.data() + at, std::min(piece, buf.size() - at));
    if (n <= 0) die("read " + file);
    at += static_cast<size_t>(n);
  }
  ::close(fd);
  return now_s() - t0;
}

struct Interop {
  Array w;
  std::vector<Array> layers;
  Array count, mask;
};
MESHRT_TREE(Interop, w, layers, count, mask)

// The values tests/data/gen_checkpoint.py --read expects (its meshrt_expected()).
int write_interop(const std::string& dir) {
  Mesh m8 = make_mesh({8}, {"x"});
  Mesh m42 = make_mesh({4, 2}, {"a", "b"});
  Interop t;
  std::vector<float> w(128);
  for (int i = 0; i < 128; ++i) w[i] = static_cast<float>(i % 17) * 0.25f - 2.0f;
  t.w = device_put(w, {16, 8}, NamedSharding(m8, P("x")));
  std::vector<double> d(8);
  for (int i = 0; i < 8; ++i) d[i] = i * 0.5 - 1.25;
  t.layers.push_back(device_put(d, {8}, NamedSharding(m8, P("x"))));
  std::vector<int32_t> ids(16);
  for (int i = 0; i < 16; ++i) ids[i] = i * 3 - 7;
  t.layers.push_back(device_put(ids, {4, 4}, NamedSharding(m42, P("a", "b"))));
  t.count = device_put(std::vector<int64_t>{-7}, {}, NamedSharding(m8, P()));
  std::vector<bool> mask(8);
  for (int i = 0; i < 8; ++i) mask[i] = i % 3 == 0;
  t.mask = device_put(mask, {8}, NamedSharding(m8, P("x")));
  checkpoint::save(dir, t, 1, {.metadata = {{"writer", "meshrt checkpoint_report --interop"}}});
  std::printf("wrote %s/1\n", dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 1024;
  int reps = 3;
  std::string base = fs::temp_directory_path().string();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--interop" && i + 1 < argc) {
      set_cpu_device_count(8);
      return write_interop(argv[i + 1]);
    }
    if (a == "--mib" && i + 1 < argc) {
      mib = std::atoll(argv[++i]);
    } else if (a == "--dir" && i + 1 < argc) {
      base = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--mib N] [--dir D] [--reps R] | --interop DIR\n", argv[0]);
      return 2;
    }
  }
  set_cpu_device_count(8);
  const std::string work = base + "/meshrt_ckpt_bench_" + std::to_string(::getpid());
  fs::create_directories(work);
  const int64_t n = mib * (int64_t{1} << 20) / 4;
  const int64_t cols = 4096;
  const Shape shape = {n / cols, cols};
  const double gib = static_cast<double>(n) * 4 / (1 << 30);
  std::printf("checkpoint_report: %.2f GiB f32 %s on 8 cpu devices, folder %s, median of %d\n", gib,
              shape_str(shape).c_str(), work.c_str(), reps);

  Mesh mesh = make_mesh({8}, {"x"});
  std::vector<float> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    host[static_cast<size_t>(i)] = static_cast<float>(i % 1000) * 0.5f;
  Array x = device_put(host, shape, NamedSharding(mesh, P("x")));
  std::vector<char> buf(static_cast<size_t>(n) * 4);
  std::memcpy(buf.data(), host.data(), buf.size());
  host = {};

  std::vector<double> bw, br, sv, rs, rr, ab, at;
  const std::string file = work + "/baseline.bin";
  const std::string ck = work + "/ckpt";
  int64_t step = 0;
  for (int r = 0; r < reps; ++r) {
    bw.push_back(baseline_write(file, buf));
    br.push_back(baseline_read(file, buf));
    fs::remove(file);

    double t0 = now_s();
    checkpoint::save(ck, x, ++step, {.keep = 1});
    sv.push_back(now_s() - t0);

    drop_tree_cache(ck);
    t0 = now_s();
    Array same = checkpoint::restore(ck, x);
    rs.push_back(now_s() - t0);
    if (!same.sharding().is_equivalent_to(x.sharding(), shape)) die("restored sharding");
    same = Array();

    drop_tree_cache(ck);
    t0 = now_s();
    Array cols_sharded = checkpoint::restore(
        ck, checkpoint::ShapeDtypeStruct{shape, DType::f32, NamedSharding(mesh, P(None, "x"))});
    rr.push_back(now_s() - t0);
    cols_sharded = Array();

    t0 = now_s();
    checkpoint::save(ck, x, ++step, {.async = true, .keep = 1});
    ab.push_back(now_s() - t0);
    checkpoint::wait_until_finished();
    at.push_back(now_s() - t0);
  }
  // Spot check: the last restore equals the saved value.
  Array back = checkpoint::restore(ck, x);
  std::vector<float> got = back.to_vector<float>();
  if (std::memcmp(got.data(), buf.data(), buf.size()) != 0) {
    std::fprintf(stderr, "checkpoint_report: the restored value differs\n");
    return 1;
  }
  fs::remove_all(work);

  auto rate = [&](double s) { return gib / s; };
  const double w = median(bw), rd = median(br), s = median(sv), r1 = median(rs), r2 = median(rr);
  std::printf("%-44s %8s %10s %8s\n", "", "seconds", "GiB/s", "ratio");
  std::printf("%-44s %8.3f %10.2f %8s\n", "baseline write (64 MiB writes + fsync)", w, rate(w),
              "1");
  std::printf("%-44s %8.3f %10.2f %8.2f\n", "save (sync, durable)", s, rate(s), w / s);
  std::printf("%-44s %8.3f %10.2f %8s\n", "baseline read (page cache dropped)", rd, rate(rd), "1");
  std::printf("%-44s %8.3f %10.2f %8.2f\n", "restore, same sharding (cache dropped)", r1, rate(r1),
              rd / r1);
  std::printf("%-44s %8.3f %10.2f %8.2f\n", "restore onto P(None, 'x') (cache dropped)", r2,
              rate(r2), rd / r2);
  std::printf("%-44s %8.4f %10s %8.3f\n", "async save: blocking time (ratio to sync)", median(ab),
              "", median(ab) / s);
  std::printf("%-44s %8.3f %10.2f\n", "async save: until wait_until_finished()", median(at),
              rate(median(at)));
  return 0;
}
