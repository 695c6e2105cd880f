// NCCL as the cuda platform's NativeComm (backends/native_comm.h).
//
// Communicators: one per member of each ordered device group, split (ncclCommSplit, key = group
// index) from a parent made with ncclCommInitAll once per set of GPUs, so every ordering of the
// same GPUs (mesh axes in another order, reversed groups) reuses that set's bootstrap. Both are
// cached and bounded (backends/comm_cache.h: a group's communicators are destroyed only when no
// member can still use them; a parent only when no cached group was split from it). Logical
// devices sharing a GPU are never passed to NCCL as distinct ranks: every call goes through a
// communicator whose creation refused such a group.
//
// Groups spanning processes (under mpirun): one communicator per local member, made by
// ncclCommInitRank (rank = group index, every local member inside one ncclGroupStart/End) from
// the unique id the process holding member 0 made; the collectives layer sends the id over the
// ProcessComm after its agreement check (backends/native_comm.h). Kept for the job's life.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backends/comm_cache.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "core/error.h"

namespace meshrt::cuda {
namespace {

using backend::CommGroup;
using backend::FoldOp;
using Transfer = backend::NativeComm::Transfer;

// Cached ordered groups, and parents (GPU sets) beyond those in use by a cached group.
constexpr size_t kMaxGroups = 16;
constexpr size_t kMaxIdleParents = 4;

std::string group_str(const std::vector<int>& group) {
  std::string s = "{";
  for (size_t i = 0; i < group.size(); ++i) s += (i ? ", " : "") + dev_name(group[i]);
  return s + "}";
}

std::string group_str(const CommGroup& group) {
  if (!group.spans()) return group_str(group.devices);
  std::string s = "{";
  for (size_t i = 0; i < group.devices.size(); ++i) {
    s += (i ? ", " : "") + std::string("p") + std::to_string(group.processes[i]) +
         ":cuda:" + std::to_string(group.devices[i]);
  }
  return s + "}";
}

std::string nccl_detail(ncclResult_t r, ncclComm_t comm) {
  std::string detail = ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0')
    detail += std::string(": ") + last;
  return detail + " (NCCL_DEBUG=WARN prints NCCL's own log)";
}

[[noreturn]] void throw_nccl(ncclResult_t r, const char* call, int device, ncclComm_t comm) {
  throw Error(std::string("[nccl] ") + call + " failed on " + dev_name(device) + ": " +
              nccl_detail(r, comm));
}
#define MESHRT_NCCL_CHECK(call, device, comm)                                     \
  do {                                                                            \
    ncclResult_t meshrt_r_ = (call);                                              \
    if (meshrt_r_ != ncclSuccess) throw_nccl(meshrt_r_, #call, (device), (comm)); \
  } while (0)

// ncclGroupStart .. ncclGroupEnd. end() reports the group's result; when something throws
// inside the group first, the destructor still ends it, or this thread's NCCL calls would stay
// grouped (and never launch) from then on.
class NcclGroup {
 public:
  NcclGroup() {
    const ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) throw Error("[nccl] ncclGroupStart failed: " + nccl_detail(r, nullptr));
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  bool open_ = true;
};

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::bool_:
      return ncclUint8;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
  }
  throw Error("[nccl] no NCCL type for " + std::string(dtype_name(t)) +
              "; use CollectiveAlgo::direct or ring");
}

class NcclComm final : public backend::NativeComm {
 public:
  explicit NcclComm(CudaBackend& be)
      : be_(be),
        groups_(kMaxGroups,
                {[this](const std::vector<int>& g) { return create(g); },
                 [this](const std::vector<int>& g, std::vector<ncclComm_t>& c) { destroy(g, c); },
                 [this](int d) { return be_.dev(d).fences.load(std::memory_order_acquire); }}) {}

  std::string_view name() const override { return "NCCL"; }

  std::string unavailable(const std::vector<int>& group) override {
    for (size_t i = 0; i < group.size(); ++i) {
      for (size_t j = i + 1; j < group.size(); ++j) {
        if (be_.dev(group[i]).gpu == be_.dev(group[j]).gpu) {
          return dev_name(group[i]) + " and " + dev_name(group[j]) +
                 " are logical devices on the same GPU " + std::to_string(be_.dev(group[i]).gpu) +
                 " (MESHRT_CUDA_DEVICES_PER_GPU=" + std::to_string(be_.per_gpu()) +
                 "), and NCCL refuses two ranks on one GPU";
        }
      }
    }
    return "";
  }

  bool spanning_open(const CommGroup& group) override {
    std::lock_guard<std::mutex> lock(spanning_mu_);
    return spanning_.count(group) != 0;
  }

  std::string new_token() override {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      throw Error("[nccl] ncclGetUniqueId failed: " + nccl_detail(r, nullptr) +
                  "; check that NCCL can open a socket on this host (NCCL_SOCKET_IFNAME)");
    }
    return std::string(reinterpret_cast<const char*>(&id), sizeof id);
  }

  void open_spanning(const CommGroup& group, int me, const std::string& token) override {
    std::vector<int> local;  // group indices of this process's members
    std::vector<int> devices;
    for (size_t k = 0; k < group.devices.size(); ++k) {
      if (group.processes[k] != me) continue;
      local.push_back(static_cast<int>(k));
      devices.push_back(group.devices[k]);
    }
    if (std::string why = unavailable(devices); !why.empty())
      throw Error("[nccl] cannot create a communicator for " + group_str(group) + ": " + why);
    ncclUniqueId id;
    if (token.size() != sizeof id) {
      throw Error("[nccl] the unique id received for " + group_str(group) + " has " +
                  std::to_string(token.size()) + " bytes, not " + std::to_string(sizeof id) +
                  "; every process must run a meshrt built against the same NCCL");
    }
    std::memcpy(&id, token.data(), sizeof id);
    const int n = static_cast<int>(group.devices.size());
    std::vector<ncclComm_t> comms(local.size(), nullptr);
    ncclResult_t r = ncclSuccess;
    {
      // Init synchronizes with the other ranks: a process driving several GPUs inits them in one
      // group. Every local rank is asked even after a failure, or the others would wait for it.
      NcclGroup g;
      for (size_t i = 0; i < local.size(); ++i) {
        be_.set(devices[i]);
        const ncclResult_t ri = ncclCommInitRank(&comms[i], n, id, local[i]);
        if (r == ncclSuccess) r = ri;
      }
      const ncclResult_t end = g.end();
      if (r == ncclSuccess) r = end;
    }
    if (r != ncclSuccess) {
      abort_all(comms);
      throw Error("[nccl] ncclCommInitRank failed for the group " + group_str(group) +
                  " spanning processes: " + nccl_detail(r, nullptr) +
                  "; two processes using one GPU (check CUDA_VISIBLE_DEVICES per process) or a "
                  "network NCCL cannot use (NCCL_SOCKET_IFNAME) are the usual causes");
    }
    std::map<int, ncclComm_t> by_device;
    for (size_t i = 0; i < local.size(); ++i) by_device[devices[i]] = comms[i];
    std::lock_guard<std::mutex> lock(spanning_mu_);
    spanning_[group] = std::move(by_device);
  }

  void all_reduce(int device, const CommGroup& group, FoldOp op, DType dtype, const void* in,
                  void* out, int64_t count) override {
    Use use = comm_for(group, device);
    const ncclRedOp_t r = op == FoldOp::max ? ncclMax : op == FoldOp::min ? ncclMin : ncclSum;
    be_.set(device);
    MESHRT_NCCL_CHECK(ncclAllReduce(in, out, static_cast<size_t>(count), nccl_type(dtype), r,
                                    use.comm, be_.dev(device).comm),
                      device, use.comm);
    use.launched();
  }

  void all_gather(int device, const CommGroup& group, const void* in, void* out,
                  int64_t bytes) override {
    Use use = comm_for(group, device);
    be_.set(device);
    MESHRT_NCCL_CHECK(ncclAllGather(in, out, static_cast<size_t>(bytes), ncclUint8, use.comm,
                                    be_.dev(device).comm),
                      device, use.comm);
    use.launched();
  }

  void reduce_scatter(int device, const CommGroup& group, DType dtype, const void* in, void* out,
                      int64_t count) override {
    Use use = comm_for(group, device);
    be_.set(device);
    MESHRT_NCCL_CHECK(ncclReduceScatter(in, out, static_cast<size_t>(count), nccl_type(dtype),
                                        ncclSum, use.comm, be_.dev(device).comm),
                      device, use.comm);
    use.launched();
  }

  void send_recv(int device, const CommGroup& group, const std::vector<Transfer>& sends,
                 const std::vector<Transfer>& recvs) override {
    Use use = comm_for(group, device);
    ncclComm_t c = use.comm;
    be_.set(device);
    cudaStream_t s = be_.dev(device).comm;
    NcclGroup g;
    for (const Transfer& t : sends) {
      MESHRT_NCCL_CHECK(
          ncclSend(t.data, static_cast<size_t>(t.bytes), ncclUint8, static_cast<int>(t.peer), c, s),
          device, c);
    }
    for (const Transfer& t : recvs) {
      MESHRT_NCCL_CHECK(
          ncclRecv(t.data, static_cast<size_t>(t.bytes), ncclUint8, static_cast<int>(t.peer), c, s),
          device, c);
    }
    MESHRT_NCCL_CHECK(g.end(), device, c);
    use.launched();
  }

 private:
  // A member's communicator for one call: an in-process group's under a lease of the group
  // cache; a spanning group's from the job-long map.
  struct Use {
    std::optional<backend::CommCache<ncclComm_t>::Lease> lease;
    ncclComm_t comm = nullptr;
    void launched() {
      if (lease) lease->launched();
    }
  };
  Use comm_for(const CommGroup& group, int device) {
    Use use;
    if (!group.spans()) {
      use.lease.emplace(groups_.acquire(group.devices, device));
      use.comm = use.lease->comm();
      return use;
    }
    std::lock_guard<std::mutex> lock(spanning_mu_);
    auto it = spanning_.find(group);
    auto at =
        it == spanning_.end() ? std::map<int, ncclComm_t>::iterator{} : it->second.find(device);
    if (it == spanning_.end() || at == it->second.end()) {
      throw Error("[nccl] " + dev_name(device) + " called for the group " + group_str(group) +
                  " spanning processes before its communicators were opened; this is a meshrt bug");
    }
    use.comm = at->second;
    return use;
  }

  struct Parent {
    std::vector<ncclComm_t> comms;  // rank r on the r-th GPU of the set (ascending)
    int children = 0;               // cached groups split from it
    uint64_t last_use = 0;
  };

  // The communicators of an ordered group, or an Error naming its devices (nothing is cached).
  std::vector<ncclComm_t> create(const std::vector<int>& group) {
    if (std::string why = unavailable(group); !why.empty())
      throw Error("[nccl] cannot create a communicator for " + group_str(group) + ": " + why);
    std::vector<int> gpus;
    for (int d : group) gpus.push_back(be_.dev(d).gpu);
    std::vector<ncclComm_t> comms(group.size(), nullptr);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    std::vector<int> set = gpus;
    std::sort(set.begin(), set.end());
    Parent& parent = parent_of(set, group);
    std::vector<ncclComm_t> split(set.size(), nullptr);
    ncclResult_t r = ncclSuccess;
    {
      // Every rank is asked even after a failure, as ncclCommInitAll does: ranks left out would
      // keep the others waiting in the group's bootstrap.
      NcclGroup g;
      for (size_t p = 0; p < set.size(); ++p) {
        const auto key = std::find(gpus.begin(), gpus.end(), set[p]) - gpus.begin();
        const ncclResult_t rp =
            ncclCommSplit(parent.comms[p], /*color=*/0, static_cast<int>(key), &split[p], nullptr);
        if (r == ncclSuccess) r = rp;
      }
      const ncclResult_t end = g.end();
      if (r == ncclSuccess) r = end;
    }
    if (r != ncclSuccess) {
      abort_all(split);
      fail(group, "ncclCommSplit", r);
    }
    for (size_t p = 0; p < set.size(); ++p) {
      const auto at = std::find(gpus.begin(), gpus.end(), set[p]) - gpus.begin();
      comms[static_cast<size_t>(at)] = split[p];
    }
    std::lock_guard<std::mutex> lock(parents_mu_);
    ++parent.children;
#else
    const ncclResult_t r =
        ncclCommInitAll(comms.data(), static_cast<int>(comms.size()), gpus.data());
    if (r != ncclSuccess) {
      abort_all(comms);
      fail(group, "ncclCommInitAll", r);
    }
#endif
    return comms;
  }

  [[noreturn]] void fail(const std::vector<int>& group, const char* call, ncclResult_t r) {
    std::string gpus;
    for (int d : group) gpus += (gpus.empty() ? "" : ", ") + std::to_string(be_.dev(d).gpu);
    throw Error(std::string("[nccl] ") + call + " failed for the group " + group_str(group) +
                " (GPUs " + gpus + "): " + nccl_detail(r, nullptr) +
                "; nothing was cached, the next collective on this group tries again");
  }

  // The parent communicators of a set of GPUs (ascending), made on first use. Called under the
  // group cache's lock, so one thread at a time creates.
  Parent& parent_of(const std::vector<int>& set, const std::vector<int>& group) {
    std::vector<std::vector<ncclComm_t>> idle;
    Parent* found = nullptr;
    {
      std::lock_guard<std::mutex> lock(parents_mu_);
      auto it = parents_.find(set);
      if (it != parents_.end()) {
        it->second.last_use = ++clock_;
        return it->second;
      }
    }
    Parent fresh;
    fresh.comms.assign(set.size(), nullptr);
    const ncclResult_t r =
        ncclCommInitAll(fresh.comms.data(), static_cast<int>(set.size()), set.data());
    if (r != ncclSuccess) {
      abort_all(fresh.comms);
      fail(group, "ncclCommInitAll", r);
    }
    {
      std::lock_guard<std::mutex> lock(parents_mu_);
      fresh.last_use = ++clock_;
      found = &parents_.emplace(set, std::move(fresh)).first->second;
      // Parents no cached group uses, beyond kMaxIdleParents, least recently used first.
      for (;;) {
        size_t unused = 0;
        auto victim = parents_.end();
        for (auto it = parents_.begin(); it != parents_.end(); ++it) {
          if (it->second.children > 0 || &it->second == found) continue;
          ++unused;
          if (victim == parents_.end() || it->second.last_use < victim->second.last_use)
            victim = it;
        }
        if (unused <= kMaxIdleParents) break;
        idle.push_back(std::move(victim->second.comms));
        parents_.erase(victim);
      }
    }
    for (auto& comms : idle) destroy_all(comms);
    return *found;
  }

  // Called by the group cache, outside its lock, once no member can still use `comms`.
  void destroy(const std::vector<int>& group, std::vector<ncclComm_t>& comms) {
    destroy_all(comms);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    std::vector<int> set;
    for (int d : group) set.push_back(be_.dev(d).gpu);
    std::sort(set.begin(), set.end());
    std::lock_guard<std::mutex> lock(parents_mu_);
    if (auto it = parents_.find(set); it != parents_.end()) --it->second.children;
#else
    (void)group;
#endif
  }

  // A clique's communicators are destroyed together: NCCL frees the clique's shared resources
  // when its last rank is destroyed. Errors cannot be reported from here.
  static void destroy_all(std::vector<ncclComm_t>& comms) {
    for (ncclComm_t c : comms) {
      if (c != nullptr) (void)ncclCommDestroy(c);
    }
    comms.clear();
  }

  // Communicators whose creation failed are not handed back by NCCL's group end; abort frees them.
  static void abort_all(std::vector<ncclComm_t>& comms) {
    for (ncclComm_t& c : comms) {
      if (c != nullptr) (void)ncclCommAbort(c);
      c = nullptr;
    }
  }

  CudaBackend& be_;
  std::mutex parents_mu_;
  std::map<std::vector<int>, Parent> parents_;  // guarded by parents_mu_; nodes stay put
  uint64_t clock_ = 0;                          // guarded by parents_mu_
  backend::CommCache<ncclComm_t> groups_;
  std::mutex spanning_mu_;
  // Groups spanning processes: per local member's device, its communicator. Never evicted.
  std::map<CommGroup, std::map<int, ncclComm_t>> spanning_;  // guarded by spanning_mu_
};

}  // namespace

std::unique_ptr<backend::NativeComm> make_nccl_comm(CudaBackend& backend) {
  return std::make_unique<NcclComm>(backend);
}

}  // namespace meshrt::cuda
