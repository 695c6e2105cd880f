// train/checkpoint.cpp: checkpoints as Zarr v3 groups: sharded writes, an atomic rename,
// resharding reads.
#include "train/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "backends/backend.h"
#include "backends/process_comm.h"
#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/tensor_ops.h"
#include "train/crc32c.h"
#include "train/json.h"
#include "train/zarr.h"

namespace meshrt::checkpoint {

using detail::cat;
using detail::quote;
namespace json = detail::json;
namespace zarr = detail::zarr;
namespace fs = std::filesystem;

namespace {

// The version this meshrt writes; it reads this one and older.
constexpr int64_t kFormatVersion = 1;
// zarr.json files larger than these are refused before they are read.
constexpr int64_t kMaxGroupJson = int64_t{256} << 20;
constexpr int64_t kMaxArrayJson = int64_t{1} << 20;
// Chunks are written and read in pieces of about this size, each checksummed while in cache; a
// chunk that is not one destination block is scattered piece by piece (no chunk-sized buffer).
constexpr size_t kPieceBytes = size_t{8} << 20;

std::string sys_error(int err) { return std::strerror(err); }

// Threads for file I/O: more than cores, so that reads and fsyncs overlap copies and checksums.
size_t io_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp<size_t>(2 * size_t{hw}, 4, 8);
}

// Runs fn(0..n-1) on up to io_threads() threads; the first exception is rethrown (the others
// stop taking tasks).
void parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  const size_t threads = std::min(n, io_threads());
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::exception_ptr first;  // guarded by mu
  auto work = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

// ---- files

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

void fsync_path(const std::string& path, const std::string& what) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECTORY));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0) {
    throw Error(cat(what, ": cannot fsync the folder ", path, ": ", sys_error(errno)));
  }
}

// Creates `path` (and missing parents); records the folders it made, whose parents must be
// fsynced. An existing folder is fine (several writers share them).
void make_dirs(const std::string& path, const std::string& what, std::set<std::string>* made) {
  if (path.empty()) return;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw Error(cat(what, ": ", path, " exists and is not a folder"));
    return;
  }
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_dirs(path.substr(0, slash), what, made);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw Error(cat(what, ": cannot create the folder ", path, ": ", sys_error(errno)));
  }
  if (made != nullptr) made->insert(path);
}

// Writes `bytes` to a new file (and, for a chunk, their CRC-32C, little-endian, after them),
// checksumming each piece while it is in cache, then fsyncs it.
void write_file(const std::string& path, const unsigned char* data, size_t bytes, bool crc32c,
                const std::string& what) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw Error(cat(what, ": cannot create ", path, ": ", sys_error(errno)));
  auto put = [&](const unsigned char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd.get(), p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw Error(cat(what, ": cannot write ", path, ": ", sys_error(errno)));
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  uint32_t crc = 0;
  for (size_t at = 0; at < bytes; at += kPieceBytes) {
    const size_t n = std::min(kPieceBytes, bytes - at);
    if (crc32c) crc = detail::crc32c(data + at, n, crc);
    put(data + at, n);
  }
  if (crc32c) {
    const unsigned char tail[4] = {
        static_cast<unsigned char>(crc), static_cast<unsigned char>(crc >> 8),
        static_cast<unsigned char>(crc >> 16), static_cast<unsigned char>(crc >> 24)};
    put(tail, 4);
  }
  if (::fsync(fd.get()) != 0)
    throw Error(cat(what, ": cannot fsync ", path, ": ", sys_error(errno)));
  if (::close(fd.release()) != 0) {
    throw Error(cat(what, ": cannot close ", path, ": ", sys_error(errno)));
  }
}

void write_text(const std::string& path, const std::string& text, const std::string& what) {
  write_file(path, reinterpret_cast<const unsigned char*>(text.data()), text.size(), false, what);
}

// Reads exactly n bytes at `offset`; false at a short file.
bool read_at(int fd, void* dst, size_t n, int64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += got;
  }
  return true;
}

// A small file's text, refusing files over max_bytes; nullopt when it does not exist.
std::optional<std::string> read_text(const std::string& path, int64_t max_bytes,
                                     const std::string& what) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw Error(cat(what, ": cannot open ", path, ": ", sys_error(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw Error(cat(what, ": ", path, " is not a regular file"));
  }
  if (st.st_size > max_bytes) {
    throw Error(cat(what, ": ", path, " is ", st.st_size, " bytes, more than the ", max_bytes,
                    " a zarr.json may have here; the checkpoint is corrupt"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  if (!read_at(fd.get(), text.data(), text.size(), 0)) {
    throw Error(cat(what, ": cannot read ", path, " (", st.st_size, " bytes)"));
  }
  return text;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// "123" -> 123 for canonical non-negative decimals; nullopt otherwise ("0123", "1.tmp-x").
std::optional<int64_t> parse_step(std::string_view name) {
  if (name.empty() || name.size() > 18 || (name.size() > 1 && name[0] == '0')) return std::nullopt;
  int64_t v = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

// The step a temporary folder "<step>.tmp-<token>" was for.
std::optional<int64_t> tmp_step(std::string_view name) {
  const size_t at = name.find(".tmp-");
  if (at == std::string_view::npos) return std::nullopt;
  return parse_step(name.substr(0, at));
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

std::string keys_path(const std::vector<std::string>& keys) {
  if (keys.empty()) return "value";  // the tree is one Array
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : "/") + k;
  return out;
}

// Zarr v3 node names: not empty, no '/', not only periods, not starting with "__".
void check_keys(const std::vector<std::string>& keys, const std::string& path,
                const std::string& what) {
  for (const std::string& k : keys) {
    const bool dots = k.find_first_not_of('.') == std::string::npos;
    if (k.empty() || k.find('/') != std::string::npos || dots || k.starts_with("__") ||
        k.find('\0') != std::string::npos) {
      throw Error(cat(what, ": ", path, " has the name ", quote(k),
                      ", which cannot name a Zarr node (names are not empty, hold no '/', are not "
                      "only periods and do not start with \"__\"); rename the map key"));
    }
  }
}

json::Value str_map(const std::map<std::string, std::string>& m) {
  json::Value o = json::Value::object();
  for (const auto& [k, v] : m) o.set(k, json::Value::string(v));
  return o;
}

// ---- the block grid of a sharding

struct Grid {
  Shape block;                 // the sharding's block shape
  Shape chunk;                 // chunk_shape: the block, with 1 for a dimension of size 0
  std::vector<Index> indices;  // per device of the sharding (device_list order)
  std::vector<int> owner;      // per device: the first device (position) holding its index
};

Grid block_grid(const Sharding& s, const Shape& shape, const std::string& what) {
  Grid g;
  try {
    g.block = s.shard_shape(shape);
    for (auto& [dev, index] : s.devices_indices_map(shape)) g.indices.push_back(std::move(index));
  } catch (const Error& e) {
    throw Error(cat(what, ": ", e.what()));
  }
  g.chunk = g.block;
  for (int64_t& c : g.chunk) c = std::max<int64_t>(c, 1);
  g.owner.resize(g.indices.size());
  std::map<Index, int> first;
  for (size_t i = 0; i < g.indices.size(); ++i) {
    g.owner[i] = first.emplace(g.indices[i], static_cast<int>(i)).first->second;
  }
  return g;
}

bool host_memory(const Tensor& t) {
  return t.valid() && detail::TensorAccess::buffer(t)->backend().host_addressable();
}

// ---- save

struct ChunkWrite {
  size_t leaf;
  std::vector<int64_t> coords;
  Tensor block;                                      // read in place (host memory)
  std::shared_ptr<std::vector<unsigned char>> host;  // or a host copy
};

struct SaveJob {
  std::string dir;
  int64_t step = 0;
  SaveOptions options;
  std::vector<zarr::ArrayMeta> metas;
  std::vector<std::string> leaf_dirs;  // relative to the step folder: "params/W/0"
  std::vector<std::string> leaf_paths;
  std::vector<std::string> sharding_strs;
  std::vector<ChunkWrite> chunks;  // this process's
};

// The job's communication library when several processes save together.
backend::ProcessComm* job_comm() {
  backend::ProcessComm* comm = backend::process_comm();
  return comm != nullptr && comm->size() > 1 ? comm : nullptr;
}

// Every process's message (the job's order); a barrier. One process: {mine}.
std::vector<std::string> exchange_all(const std::string& mine, const std::string& what) {
  backend::ProcessComm* comm = job_comm();
  if (comm == nullptr) return {mine};
  std::vector<int> all(static_cast<size_t>(comm->size()));
  for (int i = 0; i < comm->size(); ++i) all[static_cast<size_t>(i)] = i;
  std::vector<std::string> out;
  // Writes of big checkpoints take long: the deadline is generous (a dead process ends the job
  // through mpirun anyway). The highest tag keeps these apart from collectives' exchanges.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  std::vector<int> missing = comm->exchange(all, comm->max_tag(), mine, out, deadline, what);
  if (!missing.empty()) {
    throw Error(cat(what, ": process(es) ",
                    detail::join(missing, ", ", [](int r) { return cat(r); }),
                    " did not reach the checkpoint's barrier within an hour"));
  }
  return out;
}

// Throws the first process's error among `all` ("" = ok, else "E<message>").
void raise_any(const std::vector<std::string>& all) {
  for (size_t p = 0; p < all.size(); ++p) {
    if (!all[p].empty()) {
      throw Error(all.size() == 1 ? all[p].substr(1) : cat(all[p].substr(1), " (process ", p, ")"));
    }
  }
}

std::string random_token() {
  std::random_device rd;
  const uint64_t v =
      (uint64_t{rd()} << 32 ^ rd()) ^ static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);  // best effort: a leftover is removed by a later save
}

// Removes steps beyond `keep` (never `saved`) and the temporary folders of crashed saves.
void prune(const std::string& dir, int64_t saved, int keep, const std::string& own_tmp) {
  std::vector<int64_t> steps;
  std::vector<std::string> stale;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (auto s = parse_step(name)) {
      steps.push_back(*s);
    } else if (tmp_step(name) && name != own_tmp) {
      stale.push_back(name);
    }
  }
  if (keep > 0) {
    std::sort(steps.rbegin(), steps.rend());
    for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i) {
      if (steps[i] == saved) continue;
      // Renamed first, so that a crash halfway through never leaves a partial "<step>".
      const std::string name = cat(steps[i], ".tmp-removing-", random_token());
      if (::rename(join_path(dir, std::to_string(steps[i])).c_str(),
                   join_path(dir, name).c_str()) == 0) {
        stale.push_back(name);
      }
    }
  }
  for (const auto& name : stale) remove_tree(join_path(dir, name));
}

void write_checkpoint(const SaveJob& job) {
  const std::string what = cat("[checkpoint] save of step ", job.step, " to ", job.dir);
  const int rank = process_index();
  const std::string final_dir = join_path(job.dir, std::to_string(job.step));

  // 1. Process 0 makes the temporary folder and tells the others its name.
  std::string mine;
  if (rank == 0) {
    try {
      std::set<std::string> made;
      make_dirs(job.dir, what, &made);
      if (is_dir(final_dir) || ::access(final_dir.c_str(), F_OK) == 0) {
        throw Error(cat(what, ": ", final_dir,
                        " exists already; save under a new step number, or remove it first"));
      }
      const std::string tmp = cat(job.step, ".tmp-", random_token());
      if (::mkdir(join_path(job.dir, tmp).c_str(), 0755) != 0) {
        throw Error(cat(what, ": cannot create ", join_path(job.dir, tmp), ": ", sys_error(errno)));
      }
      for (const auto& d : made) {
        const std::string parent = fs::path(d).parent_path().string();
        fsync_path(parent.empty() ? "." : parent, what);
      }
      mine = "T" + tmp;
    } catch (const Error& e) {
      mine = std::string("E") + e.what();
    }
  }
  std::vector<std::string> first = exchange_all(mine, what);
  if (first[0].empty() || first[0][0] == 'E') raise_any({first[0]});
  const std::string tmp_name = first[0].substr(1);
  const std::string tmp = join_path(job.dir, tmp_name);

  // 2. Every process writes its chunks (process 0 the metadata too), fsyncing files and folders.
  std::string status;
  try {
    std::set<std::string> made;
    std::vector<std::string> dirs_needed;
    for (const auto& c : job.chunks) {
      const std::string key = zarr::chunk_key(job.metas[c.leaf], c.coords);
      const std::string file = join_path(join_path(tmp, job.leaf_dirs[c.leaf]), key);
      dirs_needed.push_back(fs::path(file).parent_path().string());
    }
    if (rank == 0) {
      for (const auto& d : job.leaf_dirs) dirs_needed.push_back(join_path(tmp, d));
    }
    std::sort(dirs_needed.begin(), dirs_needed.end());
    dirs_needed.erase(std::unique(dirs_needed.begin(), dirs_needed.end()), dirs_needed.end());
    for (const auto& d : dirs_needed) make_dirs(d, what, &made);

    std::vector<std::pair<std::string, std::string>> texts;  // (file, contents)
    if (rank == 0) {
      json::Value leaves = json::Value::array();
      std::set<std::string> groups = {""};
      for (size_t i = 0; i < job.metas.size(); ++i) {
        json::Value l = json::Value::object();
        l.set("key", json::Value::string(job.leaf_dirs[i]));
        l.set("path", json::Value::string(job.leaf_paths[i]));
        leaves.push(std::move(l));
        json::Value attrs = json::Value::object();
        json::Value m = json::Value::object();
        m.set("path", json::Value::string(job.leaf_paths[i]));
        m.set("sharding", json::Value::string(job.sharding_strs[i]));
        attrs.set("meshrt", std::move(m));
        texts.emplace_back(join_path(join_path(tmp, job.leaf_dirs[i]), "zarr.json"),
                           json::dump(zarr::array_json(job.metas[i], std::move(attrs))));
        for (size_t at = job.leaf_dirs[i].find('/'); at != std::string::npos;
             at = job.leaf_dirs[i].find('/', at + 1)) {
          groups.insert(job.leaf_dirs[i].substr(0, at));
        }
      }
      json::Value root = json::Value::object();
      json::Value m = json::Value::object();
      m.set("format_version", json::Value::integer(kFormatVersion));
      m.set("step", json::Value::integer(job.step));
      m.set("leaves", std::move(leaves));
      m.set("metadata", str_map(job.options.metadata));
      m.set("every_chunk_written", json::Value::boolean(true));
      root.set("meshrt", std::move(m));
      for (const auto& g : groups) {
        if (g.empty()) continue;
        make_dirs(join_path(tmp, g), what, &made);
        texts.emplace_back(join_path(join_path(tmp, g), "zarr.json"),
                           json::dump(zarr::group_json(json::Value::object())));
      }
      texts.emplace_back(join_path(tmp, "zarr.json"),
                         json::dump(zarr::group_json(std::move(root))));
    }

    const size_t n_chunks = job.chunks.size();
    parallel_for(n_chunks + texts.size(), [&](size_t i) {
      if (i >= n_chunks) {
        write_text(texts[i - n_chunks].first, texts[i - n_chunks].second, what);
        return;
      }
      const ChunkWrite& c = job.chunks[i];
      const zarr::ArrayMeta& meta = job.metas[c.leaf];
      const std::string file =
          join_path(join_path(tmp, job.leaf_dirs[c.leaf]), zarr::chunk_key(meta, c.coords));
      std::vector<unsigned char> staged;
      const void* data = nullptr;
      size_t bytes = 0;
      if (c.host) {
        data = c.host->data();
        bytes = c.host->size();
      } else if (host_memory(c.block)) {
        data = c.block.data();
        bytes = c.block.nbytes();
      } else {
        staged.resize(c.block.nbytes());
        if (!staged.empty()) c.block.copy_to_host(staged.data(), c.block.dtype());
        data = staged.data();
        bytes = staged.size();
      }
      write_file(file, static_cast<const unsigned char*>(data), bytes, true, what);
    });
    // Folders: each one holding an entry this process created.
    std::set<std::string> parents;
    for (const auto& d : dirs_needed) parents.insert(d);
    for (const auto& d : made) parents.insert(fs::path(d).parent_path().string());
    if (rank == 0) parents.insert(tmp);
    std::vector<std::string> list(parents.begin(), parents.end());
    parallel_for(list.size(), [&](size_t i) { fsync_path(list[i], what); });
  } catch (const Error& e) {
    status = std::string("E") + e.what();
  } catch (const std::exception& e) {
    status = cat("E", what, ": ", e.what());
  }
  std::vector<std::string> written = exchange_all(status, what);
  bool all_ok = std::all_of(written.begin(), written.end(), [](auto& s) { return s.empty(); });

  // 3. Process 0 renames the folder into place once every process has written and fsynced.
  std::string renamed;
  if (rank == 0) {
    if (!all_ok) {
      remove_tree(tmp);
    } else {
      try {
        if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
          throw Error(
              cat(what, ": cannot rename ", tmp, " to ", final_dir, ": ", sys_error(errno)));
        }
        fsync_path(job.dir, what);
        prune(job.dir, job.step, job.options.keep, tmp_name);
      } catch (const Error& e) {
        renamed = std::string("E") + e.what();
      }
    }
  }
  raise_any(written);
  std::vector<std::string> done = exchange_all(renamed, what);
  raise_any(done);
}

// The save in flight (async), joined by the next save, wait_until_finished() and restore().
struct Pending {
  std::mutex mu;
  std::thread thread;        // guarded by mu
  std::exception_ptr error;  // guarded by mu; set by the thread before it ends
};
Pending& pending() {
  static Pending* p = new Pending();  // never destroyed: joined at exit by drain_at_exit
  return *p;
}

void drain_at_exit() {
  try {
    wait_until_finished();
  } catch (const std::exception& e) {
    // Nobody is left to raise it to.
    std::fprintf(stderr, "meshrt: the async checkpoint save failed at exit: %s\n", e.what());
  }
}

}  // namespace

void wait_until_finished() {
  Pending& p = pending();
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    t = std::move(p.thread);
  }
  if (t.joinable()) t.join();  // outside the lock: the thread takes it to leave its error
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    error = std::exchange(p.error, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

namespace ckpt_detail {

Array tensor_as_array(const Tensor& t) {
  if (!t.valid()) throw Error("[checkpoint] save: a Tensor leaf is empty (never set)");
  return device_put(t, SingleDeviceSharding(t.device()));
}

Tensor array_as_tensor(const Array& a) { return detail::ArrayAccess::blocks(a)[0]; }

void throw_shape_dtype_struct_in_save(const std::string& path) {
  throw Error(cat("[checkpoint] save: ", path,
                  " is a ShapeDtypeStruct, which holds no data; save a tree of Arrays"));
}

void save_leaves(const std::string& dir, std::vector<SaveLeaf> leaves, int64_t step,
                 const SaveOptions& options) {
  wait_until_finished();
  const std::string what = cat("[checkpoint] save of step ", step, " to ", dir);
  if (dir.empty()) throw Error("[checkpoint] save: the folder name is empty");
  if (step < 0) throw Error(cat("[checkpoint] save: step ", step, " is negative; steps are >= 0"));
  if (options.keep < 0) {
    throw Error(cat("[checkpoint] save: keep = ", options.keep, "; use 0 (keep all) or more"));
  }
  SaveJob job;
  job.dir = dir;
  job.step = step;
  job.options = options;
  std::set<std::string> seen;
  const int rank = process_index();
  for (size_t li = 0; li < leaves.size(); ++li) {
    SaveLeaf& leaf = leaves[li];
    check_keys(leaf.keys, leaf.path, what);
    const std::string key = keys_path(leaf.keys);
    if (!seen.insert(key).second) {
      throw Error(
          cat(what, ": two leaves map to the Zarr path ", quote(key), " (", leaf.path, ")"));
    }
    if (detail::ArrayAccess::blocks(leaf.value).empty()) {
      throw Error(cat(what, ": ", leaf.path, " is an empty Array (never set)"));
    }
    const Array a = meshrt::detail::resolve_pending_sums(leaf.value);
    const Grid g = block_grid(a.sharding(), a.shape(), cat(what, ": ", leaf.path));
    zarr::ArrayMeta meta;
    meta.shape = a.shape();
    meta.dtype = a.dtype();
    zarr::data_type_name(a.dtype());  // an unsupported dtype fails here, not in the writer
    meta.chunk_shape = g.chunk;
    meta.fill_value.assign(dtype_size(a.dtype()), 0);
    const auto& devs = a.sharding().device_list();
    const bool empty = shape_size(a.shape()) == 0;
    for (size_t i = 0; i < devs.size() && !empty; ++i) {
      if (g.owner[i] != static_cast<int>(i) || devs[i].process_index() != rank) continue;
      ChunkWrite c;
      c.leaf = li;
      for (size_t d = 0; d < g.chunk.size(); ++d)
        c.coords.push_back(g.indices[i][d].first / g.chunk[d]);
      c.block = detail::ArrayAccess::blocks(a)[i];
      if (options.async && !host_memory(c.block)) {  // the device may reuse its memory
        c.host = std::make_shared<std::vector<unsigned char>>(c.block.nbytes());
        if (!c.host->empty()) c.block.copy_to_host(c.host->data(), c.block.dtype());
        c.block = Tensor();
      }
      job.chunks.push_back(std::move(c));
    }
    job.metas.push_back(std::move(meta));
    job.leaf_dirs.push_back(key);
    job.leaf_paths.push_back(leaf.path);
    job.sharding_strs.push_back(a.sharding().str());
  }
  if (!options.async) {
    write_checkpoint(job);
    return;
  }
  // Blocks in host memory are immutable and held here: a donating jit cannot reuse them while
  // the write runs (it reuses only blocks nothing else holds).
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(drain_at_exit); });
  Pending& p = pending();
  std::lock_guard<std::mutex> lock(p.mu);
  p.thread = std::thread([job = std::move(job), &p]() mutable {
    std::exception_ptr error;
    try {
      write_checkpoint(job);
    } catch (...) {
      error = std::current_exception();
    }
    job = SaveJob();  // drops the blocks before the join
    std::lock_guard<std::mutex> lock(p.mu);
    p.error = error;
  });
}

}  // namespace ckpt_detail

std::vector<int64_t> all_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return steps;
  if (!S_ISDIR(st.st_mode)) throw Error(cat("[checkpoint] ", dir, " is not a folder"));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    auto s = parse_step(name);
    if (s && is_dir(e.path().string()) && ::access((e.path() / "zarr.json").c_str(), F_OK) == 0) {
      steps.push_back(*s);
    }
  }
  if (ec) throw Error(cat("[checkpoint] cannot list ", dir, ": ", ec.message()));
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<int64_t> latest(const std::string& dir) {
  std::vector<int64_t> steps = all_steps(dir);
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

namespace {

// ---- restore

struct Opened {
  std::string step_dir;
  int64_t step = 0;
  json::Value meshrt;  // the group's "meshrt" attributes
};

Opened open_step(const std::string& dir, std::optional<int64_t> step, const std::string& api) {
  const std::string what = cat("[checkpoint] ", api);
  if (!is_dir(dir)) {
    throw Error(cat(what, ": the checkpoint folder ", dir,
                    " does not exist (or is not a folder); check the path"));
  }
  std::vector<int64_t> steps = all_steps(dir);
  if (!step) {
    if (steps.empty()) {
      throw Error(cat(what, ": ", dir, " holds no complete checkpoint (no <step>/zarr.json)"));
    }
    step = steps.back();
  }
  Opened o;
  o.step = *step;
  o.step_dir = join_path(dir, std::to_string(*step));
  if (!std::binary_search(steps.begin(), steps.end(), *step)) {
    throw Error(cat(what, ": step ", *step, " is not in ", dir, " (complete steps: ",
                    steps.empty() ? std::string("none")
                                  : detail::join(steps, ", ", [](int64_t s) { return cat(s); }),
                    ")"));
  }
  const std::string file = join_path(o.step_dir, "zarr.json");
  std::optional<std::string> text = read_text(file, kMaxGroupJson, what);
  if (!text) throw Error(cat(what, ": ", file, " is missing"));
  json::Value doc = json::parse(*text, cat(what, ": ", file));
  const json::Value* node = doc.find("node_type");
  const json::Value* format = doc.find("zarr_format");
  if (node == nullptr || !node->is_string() || node->as_string() != "group" || format == nullptr ||
      !format->is_integer() || format->as_int() != 3) {
    throw Error(cat(what, ": ", file, " is not a Zarr v3 group"));
  }
  const json::Value* attrs = doc.find("attributes");
  const json::Value* m = attrs != nullptr ? attrs->find("meshrt") : nullptr;
  if (m == nullptr || !m->is_object()) {
    throw Error(cat(what, ": ", file,
                    " has no \"meshrt\" attributes: not a meshrt checkpoint (write one with "
                    "checkpoint::save or tests/data/gen_checkpoint.py's layout)"));
  }
  const json::Value* version = m->find("format_version");
  if (version == nullptr || !version->is_integer() || version->as_int() < 1) {
    throw Error(cat(what, ": ", file, " has no valid meshrt format_version"));
  }
  if (version->as_int() > kFormatVersion) {
    throw Error(cat(what, ": ", o.step_dir, " has checkpoint format version ", version->as_int(),
                    "; this meshrt reads version ", kFormatVersion,
                    " and older: restore it with a newer meshrt"));
  }
  o.meshrt = *m;
  return o;
}

// A destination block being assembled: one per distinct index among this process's devices.
struct Dest {
  Index index;
  Tensor tensor;                    // on the device (host memory: written in place)
  std::vector<unsigned char> host;  // or staged here first
  unsigned char* data = nullptr;
};

struct LeafPlan {
  std::string what;  // "[checkpoint] restore: leaf 'params/W/0' (tree.params.W[0])"
  std::string array_dir;
  zarr::ArrayMeta meta;
  bool every_chunk = false;
  Shape block;
  std::vector<Dest> dests;
  std::vector<int> dest_of_device;  // per device of the sharding: its Dest, -1 when not local
};

struct ChunkRead {
  size_t leaf;
  std::vector<int64_t> coords;
  std::vector<size_t> dests;  // overlapping destinations
};

// Copies the box [lo, hi) (global coordinates) from `src` (a box at src_origin of extent src_ext)
// into `dst` (at dst_origin, extent dst_ext), rows as contiguous runs. With src == nullptr every
// element becomes `fill` (one element's bytes).
void copy_box(const unsigned char* src, const Shape& src_origin, const Shape& src_ext,
              unsigned char* dst, const Shape& dst_origin, const Shape& dst_ext, const Shape& lo,
              const Shape& hi, size_t item, const unsigned char* fill = nullptr) {
  const size_t rank = lo.size();
  for (size_t d = 0; d < rank; ++d) {
    if (hi[d] <= lo[d]) return;
  }
  if (rank == 0) {
    std::memcpy(dst, src != nullptr ? src : fill, item);
    return;
  }
  std::vector<int64_t> sstride(rank), dstride(rank);
  sstride[rank - 1] = dstride[rank - 1] = 1;
  for (size_t d = rank - 1; d > 0; --d) {
    sstride[d - 1] = sstride[d] * src_ext[d];
    dstride[d - 1] = dstride[d] * dst_ext[d];
  }
  const size_t run = static_cast<size_t>(hi[rank - 1] - lo[rank - 1]) * item;
  std::vector<unsigned char> fill_run;
  if (src == nullptr) {
    fill_run.resize(run);
    for (size_t at = 0; at < run; at += item) std::memcpy(fill_run.data() + at, fill, item);
  }
  std::vector<int64_t> at(lo.begin(), lo.end());
  while (true) {
    int64_t so = 0, doff = 0;
    for (size_t d = 0; d < rank; ++d) {
      so += (at[d] - src_origin[d]) * sstride[d];
      doff += (at[d] - dst_origin[d]) * dstride[d];
    }
    std::memcpy(dst + doff * static_cast<int64_t>(item),
                src != nullptr ? src + so * static_cast<int64_t>(item) : fill_run.data(), run);
    size_t d = rank - 1;
    while (d > 0) {
      if (++at[d - 1] < hi[d - 1]) break;
      at[d - 1] = lo[d - 1];
      --d;
    }
    if (d == 0) return;
  }
}

void read_chunk(const LeafPlan& plan, const ChunkRead& c) {
  const zarr::ArrayMeta& meta = plan.meta;
  const size_t rank = meta.shape.size();
  const size_t item = dtype_size(meta.dtype);
  const std::string key = zarr::chunk_key(meta, c.coords);
  const std::string file = join_path(plan.array_dir, key);
  const std::string where = cat(plan.what, ": chunk ", key, " (", file, ")");
  Shape origin(rank);
  for (size_t d = 0; d < rank; ++d) origin[d] = c.coords[d] * meta.chunk_shape[d];
  // Copies the box (at `from`, extent `ext`) of chunk data at `src` into every destination.
  auto scatter = [&](const unsigned char* src, const Shape& from, const Shape& ext,
                     const unsigned char* fill) {
    Shape lo(rank), hi(rank), dorigin(rank), dext(rank);
    for (size_t di : c.dests) {
      const Dest& dest = plan.dests[di];
      for (size_t d = 0; d < rank; ++d) {
        dorigin[d] = dest.index[d].first;
        dext[d] = dest.index[d].second - dest.index[d].first;
        lo[d] = std::max(from[d], dest.index[d].first);
        hi[d] = std::min(from[d] + ext[d], dest.index[d].second);
      }
      copy_box(src, from, ext, dest.data, dorigin, dext, lo, hi, item, fill);
    }
  };
  Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno != ENOENT || plan.every_chunk) {
      throw Error(
          cat(where, " cannot be opened: ", sys_error(errno),
              errno == ENOENT ? "; the checkpoint is incomplete: restore another step" : ""));
    }
    // Zarr: a chunk never written holds the fill value.
    scatter(nullptr, origin, meta.chunk_shape, meta.fill_value.data());
    return;
  }
  struct stat st {};
  const int64_t want = zarr::encoded_chunk_bytes(meta);
  if (::fstat(fd.get(), &st) != 0 || st.st_size != want) {
    throw Error(cat(where, " has ", st.st_size, " bytes where its encoding has ", want,
                    ": the file is truncated or corrupt; restore another step"));
  }
  const size_t data_bytes = static_cast<size_t>(want) - (meta.crc32c ? 4 : 0);
  auto read = [&](void* dst, size_t n, int64_t offset) {
    if (!read_at(fd.get(), dst, n, offset)) throw Error(cat(where, " could not be read"));
  };
  auto check = [&](uint32_t computed) {
    if (!meta.crc32c) return;
    unsigned char tail[4];
    read(tail, 4, static_cast<int64_t>(data_bytes));
    const uint32_t stored = uint32_t{tail[0]} | uint32_t{tail[1]} << 8 | uint32_t{tail[2]} << 16 |
                            uint32_t{tail[3]} << 24;
    if (stored != computed) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "stored 0x%08x, computed 0x%08x", stored, computed);
      throw Error(cat(where, " fails its crc32c check (", buf,
                      "): the file is corrupt; restore another step"));
    }
  };
  // The chunk is exactly one destination block (the sharding it was saved with): read in place.
  if (c.dests.size() == 1) {
    const Dest& dest = plan.dests[c.dests[0]];
    bool same = true;
    for (size_t d = 0; d < rank; ++d) {
      same = same && dest.index[d].first == origin[d] &&
             dest.index[d].second == origin[d] + meta.chunk_shape[d];
    }
    if (same) {  // in pieces, each checksummed while in cache
      uint32_t crc = 0;
      for (size_t at = 0; at < data_bytes; at += kPieceBytes) {
        const size_t n = std::min(kPieceBytes, data_bytes - at);
        read(dest.data + at, n, static_cast<int64_t>(at));
        if (meta.crc32c) crc = detail::crc32c(dest.data + at, n, crc);
      }
      check(crc);
      return;
    }
  }
  // Pieces in file order, each a box of at most kPieceBytes (the buffer never takes a size the
  // metadata chooses): one coordinate in each dimension before `split`, a run of rows in `split`,
  // whole in the dimensions after it.
  if (rank == 0) {
    unsigned char one[16];
    read(one, item, 0);
    scatter(one, origin, meta.chunk_shape, nullptr);
    check(meta.crc32c ? detail::crc32c(one, item, 0) : 0);
    return;
  }
  std::vector<size_t> inner(rank);  // bytes of one step in dimension d
  inner[rank - 1] = item;
  for (size_t d = rank - 1; d > 0; --d)
    inner[d - 1] = inner[d] * static_cast<size_t>(meta.chunk_shape[d]);
  size_t split = 0;
  while (inner[split] > kPieceBytes) ++split;  // inner[rank - 1] = one element fits
  const int64_t rows = meta.chunk_shape[split];
  const int64_t rows_per_piece = std::min<int64_t>(
      rows, static_cast<int64_t>(std::max<size_t>(1, kPieceBytes / inner[split])));
  std::unique_ptr<unsigned char[]> buf(
      new unsigned char[static_cast<size_t>(rows_per_piece) * inner[split]]);
  uint32_t crc = 0;
  Shape from = origin, ext = meta.chunk_shape;
  for (size_t d = 0; d < split; ++d) ext[d] = 1;
  while (true) {
    int64_t base = 0;  // the file offset of the piece's first row
    for (size_t d = 0; d < split; ++d)
      base += (from[d] - origin[d]) * static_cast<int64_t>(inner[d]);
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_piece) {
      const int64_t r1 = std::min(rows, r0 + rows_per_piece);
      const size_t n = static_cast<size_t>(r1 - r0) * inner[split];
      read(buf.get(), n, base + r0 * static_cast<int64_t>(inner[split]));
      if (meta.crc32c) crc = detail::crc32c(buf.get(), n, crc);
      from[split] = origin[split] + r0;
      ext[split] = r1 - r0;
      scatter(buf.get(), from, ext, nullptr);
    }
    size_t d = split;  // the next coordinate of the dimensions before `split`, row-major
    while (d > 0) {
      if (++from[d - 1] < origin[d - 1] + meta.chunk_shape[d - 1]) break;
      from[d - 1] = origin[d - 1];
      --d;
    }
    if (d == 0) break;
  }
  check(crc);
}

}  // namespace

std::map<std::string, std::string> metadata(const std::string& dir, std::optional<int64_t> step) {
  Opened o = open_step(dir, step, "metadata");
  std::map<std::string, std::string> out;
  const json::Value* m = o.meshrt.find("metadata");
  if (m != nullptr && m->is_object()) {
    for (const auto& [k, v] : m->members()) {
      if (v.is_string()) out[k] = v.as_string();
    }
  }
  return out;
}

namespace ckpt_detail {

std::vector<Array> restore_leaves(const std::string& dir, const std::vector<Target>& targets,
                                  std::optional<int64_t> step) {
  wait_until_finished();
  Opened o = open_step(dir, step, "restore");
  const std::string what = cat("[checkpoint] restore of ", o.step_dir);

  // The saved leaves against the target's.
  const json::Value* leaves = o.meshrt.find("leaves");
  if (leaves == nullptr || !leaves->is_array()) {
    throw Error(cat(what, ": the group attributes list no leaves; the checkpoint is corrupt"));
  }
  std::map<std::string, std::string> saved;  // key -> path
  for (const json::Value& l : leaves->items()) {
    const json::Value* k = l.find("key");
    const json::Value* p = l.find("path");
    if (k == nullptr || !k->is_string()) {
      throw Error(
          cat(what, ": a leaf of the group attributes has no key; the checkpoint is corrupt"));
    }
    saved[k->as_string()] = p != nullptr && p->is_string() ? p->as_string() : k->as_string();
  }
  std::set<std::string> wanted;
  for (const Target& t : targets) {
    check_keys(t.keys, t.path, what);
    const std::string key = keys_path(t.keys);
    wanted.insert(key);
    if (!saved.count(key)) {
      std::string have = detail::join(saved, ", ", [](const auto& kv) { return kv.second; });
      if (have.size() > 400) have = have.substr(0, 400) + " ...";
      throw Error(cat(what, ": tree mismatch at ", t.path, ": the checkpoint has no leaf ",
                      quote(key), " (it holds ", saved.size(), " leaves: ", have,
                      "); restore with a target tree of the saved structure"));
    }
  }
  for (const auto& [key, path] : saved) {
    if (!wanted.count(key)) {
      throw Error(cat(what, ": tree mismatch at ", path, ": the checkpoint holds leaf ", quote(key),
                      " and the target tree has no such leaf; restore with a target tree of the "
                      "saved structure"));
    }
  }
  const json::Value* every = o.meshrt.find("every_chunk_written");
  const bool every_chunk = every != nullptr && every->is_bool() && every->as_bool();

  // Plans: each leaf's metadata checked against its target, destinations allocated.
  const int rank = process_index();
  std::vector<LeafPlan> plans(targets.size());
  std::vector<ChunkRead> reads;
  for (size_t li = 0; li < targets.size(); ++li) {
    const Target& t = targets[li];
    LeafPlan& plan = plans[li];
    const std::string key = keys_path(t.keys);
    plan.what = cat(what, ": leaf ", quote(key), " (", t.path, ")");
    plan.array_dir = join_path(o.step_dir, key);
    plan.every_chunk = every_chunk;
    if (t.sharding.device_list().empty() || t.sharding.device_list()[0].id() < 0) {
      throw Error(cat(plan.what,
                      ": the target has no sharding (an unset ShapeDtypeStruct "
                      "sharding or an empty Array); give one"));
    }
    const std::string file = join_path(plan.array_dir, "zarr.json");
    std::optional<std::string> text = read_text(file, kMaxArrayJson, plan.what);
    if (!text) throw Error(cat(plan.what, ": ", file, " is missing; the checkpoint is corrupt"));
    plan.meta = zarr::parse_array(json::parse(*text, cat(plan.what, ": ", file)), plan.what);
    // As orbax (tensorstore's cast to the target's dtype), a floating leaf restores onto another
    // floating dtype, rounded to nearest even; other dtype changes are errors.
    const bool cast = is_floating(plan.meta.dtype) && is_floating(t.dtype);
    if (plan.meta.shape != t.shape || (plan.meta.dtype != t.dtype && !cast)) {
      throw Error(cat(plan.what, ": the checkpoint holds ", dtype_name(plan.meta.dtype),
                      shape_str(plan.meta.shape), " and the target is ", dtype_name(t.dtype),
                      shape_str(t.shape),
                      "; restore onto a target of the saved shape and dtype (a floating dtype "
                      "may change to another floating dtype)"));
    }
    if (plan.meta.fill_value.size() != dtype_size(plan.meta.dtype)) {
      throw Error(cat(plan.what, ": bad fill_value"));
    }
    const Grid g = block_grid(t.sharding, t.shape, plan.what);
    plan.block = g.block;
    const auto& devs = t.sharding.device_list();
    plan.dest_of_device.assign(devs.size(), -1);
    std::map<Index, int> dest_at;
    for (size_t i = 0; i < devs.size(); ++i) {
      if (devs[i].process_index() != rank) continue;
      auto [it, fresh] = dest_at.emplace(g.indices[i], static_cast<int>(plan.dests.size()));
      plan.dest_of_device[i] = it->second;
      if (!fresh) continue;
      Dest d;
      d.index = g.indices[i];
      d.tensor = empty(g.block, plan.meta.dtype, devs[i]);  // as stored; cast after reading
      if (host_memory(d.tensor)) {
        d.data = static_cast<unsigned char*>(d.tensor.data());
      } else {
        d.host.resize(d.tensor.nbytes());
        d.data = d.host.data();
      }
      plan.dests.push_back(std::move(d));
    }
    // The chunks each destination overlaps, each read once.
    std::map<std::vector<int64_t>, size_t> read_at_coords;
    const size_t r = t.shape.size();
    for (size_t di = 0; di < plan.dests.size(); ++di) {
      const Index& idx = plan.dests[di].index;
      bool empty_box = false;
      std::vector<int64_t> first(r), last(r);
      for (size_t d = 0; d < r; ++d) {
        empty_box = empty_box || idx[d].second <= idx[d].first;
        first[d] = idx[d].first / plan.meta.chunk_shape[d];
        last[d] = (idx[d].second - 1) / plan.meta.chunk_shape[d];
      }
      if (empty_box) continue;
      std::vector<int64_t> at = first;
      while (true) {
        auto [it, fresh] = read_at_coords.emplace(at, reads.size());
        if (fresh) reads.push_back({li, at, {}});
        reads[it->second].dests.push_back(di);
        size_t d = r;
        while (d > 0) {
          if (++at[d - 1] <= last[d - 1]) break;
          at[d - 1] = first[d - 1];
          --d;
        }
        if (d == 0) break;
      }
    }
  }
  parallel_for(reads.size(), [&](size_t i) { read_chunk(plans[reads[i].leaf], reads[i]); });

  std::vector<Array> out;
  out.reserve(targets.size());
  for (size_t li = 0; li < targets.size(); ++li) {
    const Target& t = targets[li];
    LeafPlan& plan = plans[li];
    for (Dest& d : plan.dests) {
      if (!d.host.empty()) {
        d.tensor = tensor(d.host.data(), shape_size(plan.block), plan.meta.dtype, plan.block,
                          d.tensor.device());
        d.host = {};
      }
      if (plan.meta.dtype != t.dtype) d.tensor = astype(d.tensor, t.dtype);
    }
    const auto& devs = t.sharding.device_list();
    std::vector<Tensor> blocks(devs.size());
    for (size_t i = 0; i < devs.size(); ++i) {
      const int di = plan.dest_of_device[i];
      if (di < 0) continue;
      const Tensor& src = plan.dests[static_cast<size_t>(di)].tensor;
      // Replicas are separate copies, one per device (as device_put makes them).
      blocks[i] =
          src.device() == devs[i]
              ? src
              : detail::ArrayAccess::blocks(device_put(src, SingleDeviceSharding(devs[i])))[0];
    }
    out.push_back(detail::ArrayAccess::make(t.shape, t.dtype, t.sharding, std::move(blocks)));
  }
  return out;
}

}  // namespace ckpt_detail

}  // namespace meshrt::checkpoint
