// Several processes: initialize() over the job's communication library, and the Arrays that span
// processes (from local data, from a callback, gathered back to every process).
#include "runtime/distributed.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "backends/process_comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/detail/copy.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/sharding_impl.h"
#include "runtime/mesh.h"

namespace meshrt {

using detail::cat;

namespace distributed {
namespace {

// The number of processes mpirun started (1 when not under mpirun).
int launched_processes() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end == '\0' && n >= 1 && n <= INT32_MAX) return static_cast<int>(n);
    }
  }
  return 1;
}

// What every process must agree on, one "name=value" per entry (device counts may differ).
std::vector<std::pair<std::string, std::string>> settings(int cpu, int cuda) {
  return {{"meshrt", "0.1.0 " __DATE__ " " __TIME__},
          {"default platform", default_platform()},
          {"MESHRT_COLLECTIVE_ALGO", config::collective_algo()},
          {"MESHRT_DETERMINISTIC", config::deterministic() ? "1" : "0"},
          {"MESHRT_COLLECTIVE_TIMEOUT", cat(config::collective_timeout().count(), " ms")},
          // Both sides of a transfer split it the same way.
          {"MESHRT_MPI_MAX_MESSAGE_BYTES", cat(config::mpi_max_message_bytes())},
          {"cpu devices", cat(cpu)},
          {"cuda devices", cat(cuda)}};
}

std::mutex g_mu;
bool g_done = false;  // guarded by g_mu

}  // namespace

bool is_initialized() { return detail::process_layout().size > 1; }

void initialize() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_done) return;
  const int launched = launched_processes();
  if (launched <= 1) {
    g_done = true;
    return;
  }
  const auto timeout = config::collective_timeout();
  std::unique_ptr<backend::ProcessComm> comm = backend::make_mpi_comm(timeout);
  const int rank = comm->rank(), size = comm->size();
  const int cpu = detail::local_device_count(Device::Kind::cpu);
  const int cuda =
      backend::cuda_backend_built() ? detail::local_device_count(Device::Kind::cuda) : 0;
  const auto mine = settings(cpu, cuda);
  std::string packed;
  for (auto& [k, v] : mine) packed += k + "=" + v + "\n";
  std::vector<int> all(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) all[static_cast<size_t>(i)] = i;
  std::vector<std::string> theirs;
  std::vector<int> missing =
      comm->exchange(all, 0, packed, theirs, std::chrono::steady_clock::now() + timeout,
                     "distributed::initialize()");
  if (!missing.empty()) {
    comm->mark_broken("initialize() timed out");
    backend::set_process_comm(std::move(comm));
    throw Error(cat("[distributed] initialize(): process(es) ",
                    detail::join(missing, ", ", [](int r) { return cat(r); }),
                    " did not call distributed::initialize() within MESHRT_COLLECTIVE_TIMEOUT (",
                    timeout.count() / 1000.0,
                    " s); every process of the job must call it first in main()"));
  }
  detail::ProcessLayout layout;
  layout.rank = rank;
  layout.size = size;
  std::string differences;
  for (int p = 0; p < size; ++p) {
    std::map<std::string, std::string> kv;
    const std::string& s = theirs[static_cast<size_t>(p)];
    for (size_t at = 0; at < s.size();) {
      size_t nl = s.find('\n', at), eq = s.find('=', at);
      kv[s.substr(at, eq - at)] = s.substr(eq + 1, nl - eq - 1);
      at = nl + 1;
    }
    layout.cpu_counts.push_back(std::atoi(kv["cpu devices"].c_str()));
    layout.cuda_counts.push_back(std::atoi(kv["cuda devices"].c_str()));
  }
  // Every process compares every process with process 0, so all raise the same error.
  for (auto& [k, v] : mine) {
    if (k == "cpu devices" || k == "cuda devices") continue;
    std::map<std::string, std::vector<int>> by_value;
    for (int p = 0; p < size; ++p) {
      const std::string& s = theirs[static_cast<size_t>(p)];
      const size_t at = s.find(k + "=");
      const size_t nl = s.find('\n', at);
      by_value[at == std::string::npos ? "?" : s.substr(at + k.size() + 1, nl - at - k.size() - 1)]
          .push_back(p);
    }
    if (by_value.size() == 1) continue;
    differences += cat(differences.empty() ? "" : "; ", k, ": ");
    bool first = true;
    for (auto& [value, procs] : by_value) {
      differences +=
          cat(first ? "" : ", ", "process(es) ",
              detail::join(procs, ",", [](int r) { return cat(r); }), " have '", value, "'");
      first = false;
    }
  }
  if (!differences.empty()) {
    backend::set_process_comm(std::move(comm));
    throw Error(cat("[distributed] initialize(): the processes of the job disagree (", differences,
                    "); run the same meshrt build with the same settings on every process"));
  }
  detail::set_process_layout(std::move(layout));
  backend::set_process_comm(std::move(comm));
  g_done = true;
}

}  // namespace distributed

Array make_array_from_callback(Shape shape, const Sharding& sharding,
                               std::function<Tensor(const Index&)> callback) {
  std::vector<Index> idx = detail::indices(sharding, shape, "make_array_from_callback");
  const Shape block = sharding.shard_shape(shape);
  const auto& devs = sharding.device_list();
  std::vector<Tensor> blocks(devs.size());
  std::optional<DType> dtype;
  for (size_t i = 0; i < devs.size(); ++i) {
    if (!detail::is_local(devs[i])) continue;
    Tensor t = callback(idx[i]);
    if (!t.valid() || t.shape() != block || (dtype && t.dtype() != *dtype)) {
      throw Error(cat("[make_array_from_callback] the callback returned ",
                      t.valid() ? t.str() : "an empty Tensor", " for the shard of ", devs[i].str(),
                      ", which needs shape ", shape_str(block),
                      dtype ? cat(" and dtype ", dtype_name(*dtype)) : std::string(),
                      "; return one Tensor of the shard's shape per index, all of one dtype"));
    }
    dtype = t.dtype();
    blocks[i] = t.device() == devs[i]
                    ? t
                    : detail::ArrayAccess::blocks(device_put(t, SingleDeviceSharding(devs[i])))[0];
  }
  if (!dtype) {
    throw Error(cat("[make_array_from_callback] this process (", process_index(),
                    ") holds no device of ", sharding.str(),
                    ", so the dtype is unknown; build the Array on a sharding that includes a "
                    "device of every process"));
  }
  return detail::ArrayAccess::make(std::move(shape), *dtype, sharding, std::move(blocks));
}

Array make_array_from_process_local_data(const Sharding& sharding, const Tensor& local,
                                         Shape global_shape) {
  if (!local.valid())
    throw Error("[make_array_from_process_local_data] an empty (default-constructed) Tensor");
  if (process_count() == 1) {
    if (global_shape != local.shape()) {
      throw Error(
          cat("[make_array_from_process_local_data] with one process the local data is "
              "the global value, but it has shape ",
              shape_str(local.shape()), " and global_shape is ", shape_str(global_shape),
              "; pass global_shape = local.shape()"));
    }
    return device_put(local, sharding);
  }
  const std::string what = "make_array_from_process_local_data";
  if (local.shape().size() != global_shape.size()) {
    throw Error(cat("[", what, "] local data of rank ", local.shape().size(),
                    " for a global shape of rank ", global_shape.size(), " (",
                    shape_str(global_shape), "); pass data of the same rank"));
  }
  std::vector<Index> idx = detail::indices(sharding, global_shape, what);
  const Shape block = sharding.shard_shape(global_shape);
  const auto& devs = sharding.device_list();
  // Per dimension: the starts of this process's shards, sorted; they map to consecutive blocks.
  const size_t rank = global_shape.size();
  std::vector<std::vector<int64_t>> starts(rank);
  for (size_t i = 0; i < devs.size(); ++i) {
    if (!detail::is_local(devs[i])) continue;
    for (size_t d = 0; d < rank; ++d) starts[d].push_back(idx[i][d].first);
  }
  for (size_t d = 0; d < rank; ++d) {
    std::sort(starts[d].begin(), starts[d].end());
    starts[d].erase(std::unique(starts[d].begin(), starts[d].end()), starts[d].end());
    const int64_t want = static_cast<int64_t>(starts[d].size()) * block[d];
    if (local.shape()[d] != global_shape[d] && local.shape()[d] != want) {
      throw Error(cat("[", what, "] dimension ", d, " of the local data is ", local.shape()[d],
                      " but process ", process_index(), " holds ", want, " of the global ",
                      global_shape[d], " along it under ", sharding.str(),
                      "; pass either the whole extent or exactly this process's part"));
    }
  }
  std::vector<Tensor> blocks(devs.size());
  for (size_t i = 0; i < devs.size(); ++i) {
    if (!detail::is_local(devs[i])) continue;
    Shape at(rank);
    for (size_t d = 0; d < rank; ++d) {
      const int64_t s = idx[i][d].first;
      if (local.shape()[d] == global_shape[d]) {
        at[d] = s;
      } else {
        const auto k = std::lower_bound(starts[d].begin(), starts[d].end(), s) - starts[d].begin();
        at[d] = k * block[d];
      }
    }
    Tensor t = empty(block, local.dtype(), devs[i]);
    detail::copy_box({t.data(), block, Shape(rank, 0), devs[i], false},
                     {local.data(), local.shape(), at, local.device(), false}, block,
                     dtype_size(local.dtype()));
    blocks[i] = std::move(t);
  }
  return detail::ArrayAccess::make(std::move(global_shape), local.dtype(), sharding,
                                   std::move(blocks));
}

Tensor process_allgather(const Array& x) {
  if (detail::ArrayAccess::blocks(x).empty())
    throw Error("[process_allgather] an empty (default-constructed) Array");
  const std::string platform(x.sharding().platform());
  // One device per process, each holding the whole value: one copy crosses to each process.
  std::vector<Device> firsts;
  for (const Device& d : devices(platform)) {
    if (firsts.empty() || firsts.back().process_index() != d.process_index()) firsts.push_back(d);
  }
  const int64_t n = static_cast<int64_t>(firsts.size());
  Array whole = device_put(x, NamedSharding(Mesh(firsts, {n}, {"processes"}), P()));
  for (const Tensor& t : detail::ArrayAccess::blocks(whole)) {
    if (t.valid()) return t;
  }
  throw Error("[process_allgather] this process has no device of the platform");
}

}  // namespace meshrt
