// Open MPI behind backends/process_comm.h: initialisation, bounded waits, per-group
// communicators, and the exit step that never leaves a peer waiting.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "backends/plugin.h"
#include "backends/process_comm.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/threads/fiber_executor.h"

namespace meshrt::backend {
namespace {

using detail::cat;

#define MESHRT_MPI_CHECK(call)                                                               \
  do {                                                                                       \
    const int rc_ = (call);                                                                  \
    if (rc_ != MPI_SUCCESS) {                                                                \
      char text_[MPI_MAX_ERROR_STRING];                                                      \
      int len_ = 0;                                                                          \
      MPI_Error_string(rc_, text_, &len_);                                                   \
      throw Error(cat("[mpi] ", #call, " failed: ", std::string(text_, len_),                \
                      "; check that every process runs the same program under one mpirun")); \
    }                                                                                        \
  } while (0)

// What a process waits for, printed if mpirun ends it (SIGTERM: a peer died). Written by the
// waiting thread, read by the signal handler: a torn read only garbles the diagnostic.
char g_pending[1024];
std::atomic<int> g_waiting{0};
int g_rank = -1;

void write_all(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

extern "C" void on_sigterm(int sig) {
  char head[160];
  std::snprintf(head, sizeof head,
                "[distributed] process %d was ended by mpirun (another process of the job died "
                "or failed)",
                g_rank);
  write_all(head);
  if (g_waiting.load() > 0) {
    write_all(" while waiting in ");
    write_all(g_pending);
  }
  write_all("\n");
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void note_pending(const std::string& what) {
  std::strncpy(g_pending, what.c_str(), sizeof g_pending - 1);
  g_pending[sizeof g_pending - 1] = '\0';
}

struct Waiting {  // marks a bounded wait for the SIGTERM diagnostic
  explicit Waiting(const std::string& what) {
    note_pending(what);
    g_waiting.fetch_add(1);
  }
  ~Waiting() { g_waiting.fetch_sub(1); }
};

// Polls without burning a core another device needs: on a fiber, the other devices sharing the
// thread run between polls (a device of another group may be the one a peer process waits
// for); then the thread yields, and after a while sleeps briefly.
class Poll {
 public:
  explicit Poll(ProcessComm::Deadline deadline) : deadline_(deadline) {}
  // False once the deadline has passed.
  bool next() {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline_) return false;
    // On a fiber: the thread's other devices run first (a deadline already passed makes this
    // fiber runnable again at once, with no sleep), then the thread yields as below.
    if (core::on_fiber()) {
      static const std::atomic<uint32_t> never{0};
      core::cooperative_wait(never, 0, now);
    }
    if (++n_ < 4096) {
      std::this_thread::yield();
      return true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    return true;
  }

 private:
  ProcessComm::Deadline deadline_;
  int64_t n_ = 0;
};

int checked_int(int64_t v, const char* what) {
  if (v < 0 || v > INT32_MAX) {
    throw Error(cat("[mpi] ", what, " of ", v,
                    " exceeds MPI's int count; split the operation into smaller ones"));
  }
  return static_cast<int>(v);
}

class MpiComm final : public ProcessComm {
 public:
  explicit MpiComm(std::chrono::milliseconds timeout) : timeout_(timeout) {
    int inited = 0;
    MESHRT_MPI_CHECK(MPI_Initialized(&inited));
    if (!inited) {
      int provided = 0;
      MESHRT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      if (provided < MPI_THREAD_MULTIPLE) {
        throw Error(cat("[mpi] the MPI library gives thread level ", provided,
                        ", not MPI_THREAD_MULTIPLE (3), which meshrt's device threads need; use an "
                        "Open MPI built with thread support (Debian's openmpi-bin is)"));
      }
      owns_mpi_ = true;
    }
    MESHRT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MESHRT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    MESHRT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &check_));
    MESHRT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &p2p_));
    MESHRT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &exit_));
    MESHRT_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group_));
    int* tag_ub = nullptr;
    int found = 0;
    MESHRT_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found));
    if (found && tag_ub != nullptr) max_tag_ = *tag_ub;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    name_ = std::string(version, static_cast<size_t>(len));
    if (auto comma = name_.find(','); comma != std::string::npos) name_.resize(comma);
    g_rank = rank_;
    std::signal(SIGTERM, on_sigterm);
  }

  std::string name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int max_tag() const override { return max_tag_; }

  std::vector<int> exchange(const std::vector<int>& procs, int tag, const std::string& mine,
                            std::vector<std::string>& out, Deadline deadline,
                            const std::string& what) override {
    return exchange_on(check_, procs, tag, mine, out, deadline, what);
  }

  bool open_group(const std::vector<int>& procs, int key, Deadline deadline) override {
    return group_comm(procs, key, deadline) != MPI_COMM_NULL;
  }

  bool all_gather(const std::vector<int>& procs, int key, const void* in, void* out,
                  const std::vector<int64_t>& counts, Deadline deadline) override {
    MPI_Comm comm = group_comm(procs, key, deadline);
    if (comm == MPI_COMM_NULL) return false;
    std::vector<int> c(counts.size()), displs(counts.size());
    int64_t at = 0;
    int me = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      c[k] = checked_int(counts[k], "an all-gather byte count");
      displs[k] = checked_int(at, "an all-gather offset");
      at += counts[k];
      if (procs[k] == rank_) me = static_cast<int>(k);
    }
    MPI_Request req;
    MESHRT_MPI_CHECK(MPI_Iallgatherv(in, c[static_cast<size_t>(me)], MPI_BYTE, out, c.data(),
                                     displs.data(), MPI_BYTE, comm, &req));
    return wait(req, deadline);
  }

  std::vector<int> send_recv(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                             Deadline deadline, const std::string& what) override {
    throw_if_broken();
    return post_and_wait(p2p_, {}, sends, recvs, deadline, what);
  }

  std::vector<int> send_recv_group(const std::vector<int>& procs, int key,
                                   const std::vector<Transfer>& sends,
                                   const std::vector<Transfer>& recvs, Deadline deadline,
                                   const std::string& what) override {
    MPI_Comm comm = group_comm(procs, key, deadline);
    if (comm == MPI_COMM_NULL) {  // the group's creation did not complete: every peer is missing
      std::vector<int> missing;
      for (int p : procs)
        if (p != rank_) missing.push_back(p);
      return missing;
    }
    return post_and_wait(comm, procs, sends, recvs, deadline, what);
  }

  void mark_broken(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = why;
  }
  std::string broken() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  // The exit step: a bounded handshake with every process, then MPI_Finalize; when this process
  // saw a failure or a peer never reaches the end, MPI_Abort ends the whole job instead of
  // leaving a process blocked in MPI_Finalize.
  void at_exit() {
    std::string why = broken();
    if (why.empty()) {
      std::vector<int> all(static_cast<size_t>(size_));
      for (int i = 0; i < size_; ++i) all[static_cast<size_t>(i)] = i;
      std::vector<std::string> out;
      std::vector<int> missing;
      try {
        // Twice the collective timeout: a process still waiting in its last collective reports
        // its own error before a peer at the exit gives up on it.
        missing =
            exchange_on(exit_, all, 0, "exit", out, std::chrono::steady_clock::now() + 2 * timeout_,
                        "the exit handshake");
      } catch (const std::exception& e) {
        why = e.what();
      }
      if (!missing.empty()) {
        why = cat("process(es) ", detail::join(missing, ", ", [](int r) { return cat(r); }),
                  " did not reach the end of the program within twice MESHRT_COLLECTIVE_TIMEOUT");
      }
    }
    if (!why.empty()) {
      std::string msg =
          cat("[distributed] process ", rank_, " ends the job (MPI_Abort): ", why, "\n");
      write_all(msg.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    free_handles();
    if (owns_mpi_) MPI_Finalize();
  }

 private:
  // Frees every communicator and group this object made: MPI leaves that to the caller, and Open
  // MPI keeps what is not freed to the end of the process (LeakSanitizer's reports under
  // MPI_Comm_dup and MPI_Comm_create_group). Every member of a group frees its communicator in
  // the same order (the map's); a creation still pending means the job broke and aborted instead.
  void free_handles() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // the program finalized MPI itself: the handles went with it
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, made] : comms_) {
      if (made.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      try {
        MPI_Comm c = made.get();
        if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
      } catch (const std::exception&) {  // its creation failed: nothing to free
      }
    }
    comms_.clear();
    for (MPI_Comm* c : {&check_, &p2p_, &exit_})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    if (world_group_ != MPI_GROUP_NULL) MPI_Group_free(&world_group_);
  }

  void throw_if_broken() const {
    std::string why = broken();
    if (!why.empty()) {
      throw Error(cat("[distributed] an earlier operation across processes failed (", why,
                      "); the job cannot communicate any more: end the program (it ends the job "
                      "at exit)"));
    }
  }

  // Posts every transfer on `comm` (peers are job ranks; `procs` maps them to the communicator's
  // ranks, empty: the job's), waits for all; returns the peers of those not done by `deadline`.
  std::vector<int> post_and_wait(MPI_Comm comm, const std::vector<int>& procs,
                                 const std::vector<Transfer>& sends,
                                 const std::vector<Transfer>& recvs, Deadline deadline,
                                 const std::string& what) {
    const auto rank_in = [&](int peer) {
      if (procs.empty()) return peer;
      return static_cast<int>(std::lower_bound(procs.begin(), procs.end(), peer) - procs.begin());
    };
    std::vector<MPI_Request> reqs;
    std::vector<int> peers;
    for (const Transfer& t : sends) {
      reqs.emplace_back();
      peers.push_back(t.peer);
      MESHRT_MPI_CHECK(MPI_Isend(t.data, checked_int(t.bytes, "a message size"), MPI_BYTE,
                                 rank_in(t.peer), t.tag, comm, &reqs.back()));
    }
    for (const Transfer& t : recvs) {
      reqs.emplace_back();
      peers.push_back(t.peer);
      MESHRT_MPI_CHECK(MPI_Irecv(t.data, checked_int(t.bytes, "a message size"), MPI_BYTE,
                                 rank_in(t.peer), t.tag, comm, &reqs.back()));
    }
    Waiting waiting(what);
    Poll poll(deadline);
    for (;;) {
      int done = 0;
      MESHRT_MPI_CHECK(
          MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
      if (done) return {};
      if (!poll.next()) break;
    }
    std::vector<int> missing;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] != MPI_REQUEST_NULL) missing.push_back(peers[i]);
    }
    return missing;
  }

  bool wait(MPI_Request& req, Deadline deadline) {
    Poll poll(deadline);
    for (;;) {
      int done = 0;
      MESHRT_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return true;
      if (!poll.next()) return false;
    }
  }

  std::vector<int> exchange_on(MPI_Comm comm, const std::vector<int>& procs, int tag,
                               const std::string& mine, std::vector<std::string>& out,
                               Deadline deadline, const std::string& what) {
    throw_if_broken();
    out.assign(procs.size(), std::string());
    std::vector<MPI_Request> sends;
    std::vector<size_t> pending;  // indices into procs still to receive from
    for (size_t k = 0; k < procs.size(); ++k) {
      if (procs[k] == rank_) {
        out[k] = mine;
        continue;
      }
      sends.emplace_back();
      MESHRT_MPI_CHECK(MPI_Isend(mine.data(),
                                 checked_int(static_cast<int64_t>(mine.size()), "size"), MPI_BYTE,
                                 procs[k], tag, comm, &sends.back()));
      pending.push_back(k);
    }
    Waiting waiting(what);
    Poll poll(deadline);
    for (;;) {
      for (size_t i = 0; i < pending.size();) {
        const size_t k = pending[i];
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        MESHRT_MPI_CHECK(MPI_Improbe(procs[k], tag, comm, &flag, &msg, &st));
        if (!flag) {
          ++i;
          continue;
        }
        int n = 0;
        MPI_Get_count(&st, MPI_BYTE, &n);
        out[k].resize(static_cast<size_t>(n));
        MESHRT_MPI_CHECK(MPI_Mrecv(out[k].data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
        pending[i] = pending.back();
        pending.pop_back();
      }
      int sent = 0;
      MESHRT_MPI_CHECK(
          MPI_Testall(static_cast<int>(sends.size()), sends.data(), &sent, MPI_STATUSES_IGNORE));
      if (pending.empty() && sent) return {};
      if (!poll.next()) break;
    }
    std::vector<int> missing;
    for (size_t k : pending) missing.push_back(procs[k]);
    if (missing.empty()) missing.push_back(-1);  // received everything, a send never completed
    return missing;
  }

  // The communicator of one process group, created by its members only (MPI_Comm_create_group,
  // `key` as the tag keeps concurrent creations apart) on first use, after the caller's exchange
  // has shown every member is here, and cached; MPI_COMM_NULL when its creation did not complete
  // by `deadline`. MPI_Comm_create_group blocks until every process of
  // the group has called it, so it runs on a thread of its own while the caller polls: a device
  // on a fiber must not block the thread its sibling devices (maybe creating another group that
  // the other processes create first) run on.
  MPI_Comm group_comm(const std::vector<int>& procs, int key, Deadline deadline) {
    throw_if_broken();
    std::shared_future<MPI_Comm> comm;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::pair<std::vector<int>, int> k{procs, key};
      auto it = comms_.find(k);
      if (it == comms_.end()) {
        auto made = std::make_shared<std::promise<MPI_Comm>>();
        it = comms_.emplace(std::move(k), made->get_future().share()).first;
        std::thread([this, procs, key, made] {
          try {
            MPI_Group g;
            MESHRT_MPI_CHECK(
                MPI_Group_incl(world_group_, static_cast<int>(procs.size()), procs.data(), &g));
            MPI_Comm c;
            MESHRT_MPI_CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, g, key, &c));
            MPI_Group_free(&g);
            made->set_value(c);
          } catch (...) {
            made->set_exception(std::current_exception());
          }
        }).detach();
      }
      comm = it->second;
    }
    Poll poll(deadline);
    while (comm.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      if (!poll.next()) return MPI_COMM_NULL;
    }
    return comm.get();
  }

  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 1;
  int max_tag_ = 32767;  // the MPI standard's guaranteed minimum
  bool owns_mpi_ = false;
  std::string name_;
  MPI_Comm check_ = MPI_COMM_NULL, p2p_ = MPI_COMM_NULL, exit_ = MPI_COMM_NULL;
  MPI_Group world_group_ = MPI_GROUP_NULL;
  mutable std::mutex mu_;
  std::string broken_;  // guarded by mu_
  std::map<std::pair<std::vector<int>, int>, std::shared_future<MPI_Comm>> comms_;  // by mu_
};

MpiComm* g_comm = nullptr;  // for the exit step; owned by the process_comm registry

extern "C" void mpi_at_exit() {
  if (g_comm != nullptr) g_comm->at_exit();
}

}  // namespace

}  // namespace meshrt::backend

// The plugin's entry points (backends/plugin.h): the core calls these after dlopen.
extern "C" int meshrt_plugin_abi() { return meshrt::backend::kPluginAbi; }
extern "C" meshrt::backend::ProcessComm* meshrt_mpi_comm(long long timeout_ms) {
  auto comm = std::make_unique<meshrt::backend::MpiComm>(std::chrono::milliseconds(timeout_ms));
  meshrt::backend::g_comm = comm.get();
  std::atexit(meshrt::backend::mpi_at_exit);
  return comm.release();
}
