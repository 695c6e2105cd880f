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
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "backends/plugin.h"
#include "backends/process_comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/threads/fiber_executor.h"

namespace meshrt::backend {
namespace {

using detail::cat;

void mark_job_broken(const std::string& why);  // the job's ProcessComm, when one exists

// A failed MPI call. The communicators meshrt makes return errors (MPI_ERRORS_RETURN) instead of
// ending the job, so a failure is a meshrt::Error; the job's message state is unknown after it, so
// the job is marked broken (it ends at exit with MPI_Abort, as after a timeout).
[[noreturn]] void mpi_failed(int rc, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  const std::string msg =
      cat("[mpi] ", call, " failed: ", std::string(text, static_cast<size_t>(len)),
          "; check that every process runs the same program under one mpirun");
  mark_job_broken(msg);
  throw Error(msg);
}

#define MESHRT_MPI_CHECK(call)                      \
  do {                                              \
    const int rc_ = (call);                         \
    if (rc_ != MPI_SUCCESS) mpi_failed(rc_, #call); \
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

// An int for MPI: the callers only pass values bounded by MESHRT_MPI_MAX_MESSAGE_BYTES or by a
// count of requests, so a value outside is a bug here, not the user's.
int checked_int(int64_t v, const char* what) {
  if (v < 0 || v > INT32_MAX) {
    throw Error(cat("[mpi] ", what, " of ", v, " is outside MPI's int range (0..", INT32_MAX,
                    "); this is a bug in meshrt's mpi backend"));
  }
  return static_cast<int>(v);
}

// The MPI messages a transfer of `bytes` moves as, at most `cap` bytes each: consecutive pieces of
// `cap` bytes, the last one the rest (an empty transfer is one empty message). MPI's counts are
// ints; a transfer above INT_MAX bytes is several messages, never an error.
int64_t pieces_of(int64_t bytes, int64_t cap) { return bytes == 0 ? 1 : (bytes + cap - 1) / cap; }

// An exchange's message starts with its length (8 bytes); one this short travels whole with it in
// one message, a longer one follows the length in pieces.
constexpr int64_t kHeadBytes = 8;
constexpr int64_t kInlineBytes = 64 * 1024;
// A length above this is not meshrt's header (another build on another process): an error, not
// an allocation of that size.
constexpr int64_t kMaxExchangeBytes = int64_t{1} << 44;

class MpiComm final : public ProcessComm {
 public:
  // Reads MESHRT_MPI_MAX_MESSAGE_BYTES before MPI starts: a malformed value is an error with no
  // MPI state to clean up.
  explicit MpiComm(std::chrono::milliseconds timeout)
      : timeout_(timeout), cap_(config::mpi_max_message_bytes()) {
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
    for (MPI_Comm c : {check_, p2p_, exit_})
      MESHRT_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
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
    int64_t total = 0;
    size_t me = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      total += counts[k];
      if (procs[k] == rank_) me = k;
    }
    // Every process computes the same counts, so all take the same path.
    if (total <= cap_) {  // every count and offset fits MPI's int: one collective
      std::vector<int> c(counts.size()), displs(counts.size());
      int64_t at = 0;
      for (size_t k = 0; k < counts.size(); ++k) {
        c[k] = checked_int(counts[k], "an all-gather byte count");
        displs[k] = checked_int(at, "an all-gather offset");
        at += counts[k];
      }
      MPI_Request req;
      MESHRT_MPI_CHECK(
          MPI_Iallgatherv(in, c[me], MPI_BYTE, out, c.data(), displs.data(), MPI_BYTE, comm, &req));
      return wait(req, deadline);
    }
    // Above it the offsets (and maybe a count) exceed an int: point to point, in pieces, on the
    // group's tag reserved for this (send_recv_group's tags stay below it).
    std::vector<Transfer> sends, recvs;
    int64_t at = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      char* dst = static_cast<char*>(out) + at;
      at += counts[k];
      if (k == me) {
        if (counts[k] > 0 && dst != in) std::memmove(dst, in, static_cast<size_t>(counts[k]));
        continue;
      }
      sends.push_back({procs[k], max_tag_, const_cast<void*>(in), counts[me]});
      recvs.push_back({procs[k], max_tag_, dst, counts[k]});
    }
    return post_and_wait(comm, procs, sends, recvs, deadline, "an all-gather across processes")
        .empty();
  }

  std::vector<int> send_recv(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                             Deadline deadline, const std::string& what) override {
    throw_if_broken();
    check_tags(sends, recvs, max_tag_, what);
    return post_and_wait(p2p_, {}, sends, recvs, deadline, what);
  }

  std::vector<int> send_recv_group(const std::vector<int>& procs, int key,
                                   const std::vector<Transfer>& sends,
                                   const std::vector<Transfer>& recvs, Deadline deadline,
                                   const std::string& what) override {
    check_tags(sends, recvs, max_tag_ - 1, what);
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

  // Tags the caller chose outside 0..`limit` (the group's top tag is all_gather's).
  static void check_tags(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs,
                         int limit, const std::string& what) {
    for (const auto* list : {&sends, &recvs}) {
      for (const Transfer& t : *list) {
        if (t.tag < 0 || t.tag > limit || t.bytes < 0) {
          throw Error(cat("[mpi] ", what, ": a transfer with process ", t.peer, " has tag ", t.tag,
                          " (allowed: 0..", limit, ") and ", t.bytes,
                          " bytes; this is a bug in the caller"));
        }
      }
    }
  }

  // Marks the job broken and throws: a transfer went wrong in a way no later call can repair.
  [[noreturn]] void fail(const std::string& msg) {
    mark_broken(msg);
    throw Error(msg);
  }

  // One MPI message of a transfer: its length (index -1, a split transfer's first message) or a
  // piece of its bytes.
  struct Piece {
    const Transfer* transfer;
    bool recv;
    int64_t index, of;  // its place among the transfer's pieces
    int bytes;
    int64_t* length;  // the length message's value
  };

  // A completed message: an error, a length other than this side's, or a receive shorter than its
  // piece ends the job's messaging (the sides disagree on what moves between them; later messages
  // would land in the wrong places).
  void check_piece(const Piece& p, const MPI_Status& st, bool error_in_status,
                   const std::string& what) {
    const Transfer& t = *p.transfer;
    const std::string transfer = cat("a ", t.bytes, "-byte transfer ", p.recv ? "from" : "to",
                                     " process ", t.peer, " (tag ", t.tag, ")");
    const std::string which = p.index < 0 ? cat("the length of ", transfer)
                              : p.of == 1 ? transfer
                                          : cat("piece ", p.index + 1, " of ", p.of, " (", p.bytes,
                                                " bytes) of ", transfer);
    const std::string fix =
        "; the processes disagree on what moves between them: every process must make the same "
        "calls, with the same arguments, in the same order";
    if (error_in_status && st.MPI_ERROR != MPI_SUCCESS) {
      if (p.recv && st.MPI_ERROR == MPI_ERR_TRUNCATE) {
        fail(cat("[distributed] ", what, ": process ", t.peer, " sent process ", rank_,
                 " more bytes than ", which, " holds", fix));
      }
      char text[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(st.MPI_ERROR, text, &len);
      fail(cat("[distributed] ", what, ": ", which, " on process ", rank_,
               " failed: ", std::string(text, static_cast<size_t>(len))));
    }
    if (!p.recv) return;
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    if (n != p.bytes) {
      fail(cat("[distributed] ", what, ": process ", rank_, " received ", n, " bytes from process ",
               t.peer, " for ", which, fix));
    }
    if (p.index < 0 && *p.length != t.bytes) {
      fail(cat("[distributed] ", what, ": process ", t.peer, " sends process ", rank_, " ",
               *p.length, " bytes where it expects ", transfer, fix));
    }
  }

  // Posts every transfer on `comm` (peers are job ranks; `procs` maps them to the communicator's
  // ranks, empty: the job's), waits for all; returns the peers of those not done by `deadline`.
  // A transfer above cap_ bytes is its length (8 bytes, checked by the receiver) and then its
  // pieces (pieces_of); all share its tag and are posted in order on both sides, so MPI's order
  // between a pair (one tag, one communicator) matches them up, as it matches whole transfers
  // that share a tag.
  std::vector<int> post_and_wait(MPI_Comm comm, const std::vector<int>& procs,
                                 const std::vector<Transfer>& sends,
                                 const std::vector<Transfer>& recvs, Deadline deadline,
                                 const std::string& what) {
    const auto rank_in = [&](int peer) {
      if (procs.empty()) return peer;
      return static_cast<int>(std::lower_bound(procs.begin(), procs.end(), peer) - procs.begin());
    };
    // The length messages' values, one per transfer; kept past a timeout (abandon), since MPI
    // may still use them.
    auto lengths = std::make_shared<std::vector<int64_t>>(sends.size() + recvs.size());
    std::vector<MPI_Request> reqs;
    std::vector<Piece> pieces;
    const auto message = [&](const Transfer& t, bool recv, void* data, int bytes, Piece piece) {
      reqs.push_back(MPI_REQUEST_NULL);
      pieces.push_back(piece);
      if (recv) {
        MESHRT_MPI_CHECK(
            MPI_Irecv(data, bytes, MPI_BYTE, rank_in(t.peer), t.tag, comm, &reqs.back()));
      } else {
        MESHRT_MPI_CHECK(
            MPI_Isend(data, bytes, MPI_BYTE, rank_in(t.peer), t.tag, comm, &reqs.back()));
      }
    };
    const auto post = [&](const Transfer& t, bool recv, int64_t* length) {
      const int64_t of = pieces_of(t.bytes, cap_);
      if (of > 1) {
        *length = recv ? -1 : t.bytes;
        message(t, recv, length, sizeof *length, {&t, recv, -1, of, sizeof *length, length});
      }
      for (int64_t i = 0; i < of; ++i) {
        const int64_t at = i * cap_;
        const int bytes = checked_int(std::min(cap_, t.bytes - at), "a message's byte count");
        message(t, recv, static_cast<char*>(t.data) + at, bytes, {&t, recv, i, of, bytes, length});
      }
    };
    for (size_t i = 0; i < sends.size(); ++i) post(sends[i], false, &(*lengths)[i]);
    for (size_t i = 0; i < recvs.size(); ++i) post(recvs[i], true, &(*lengths)[sends.size() + i]);
    const int count = checked_int(static_cast<int64_t>(reqs.size()), "a call's MPI message count");
    std::vector<int> indices(reqs.size());
    std::vector<MPI_Status> statuses(reqs.size());
    Waiting waiting(what);
    Poll poll(deadline);
    try {
      for (int left = count; left > 0;) {
        int done = 0;
        const int rc = MPI_Testsome(count, reqs.data(), &done, indices.data(), statuses.data());
        if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) mpi_failed(rc, "MPI_Testsome");
        if (done == MPI_UNDEFINED) break;
        for (int i = 0; i < done; ++i) {
          check_piece(pieces[static_cast<size_t>(indices[static_cast<size_t>(i)])],
                      statuses[static_cast<size_t>(i)], rc == MPI_ERR_IN_STATUS, what);
        }
        left -= done;
        if (done == 0 && !poll.next()) break;
      }
    } catch (...) {
      abandon(lengths);
      throw;
    }
    std::vector<int> missing;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] != MPI_REQUEST_NULL) missing.push_back(pieces[i].transfer->peer);
    }
    if (!missing.empty()) abandon(lengths);
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

  // Every process's message: its length first (kHeadBytes), with the message itself when that is
  // short (kInlineBytes), else followed by it in pieces of at most cap_ bytes. The receiver sizes
  // the message from the length and takes pieces until it is whole, so no count exceeds an int
  // and the sender's cap decides the pieces.
  std::vector<int> exchange_on(MPI_Comm comm, const std::vector<int>& procs, int tag,
                               const std::string& mine, std::vector<std::string>& out,
                               Deadline deadline, const std::string& what) {
    throw_if_broken();
    out.assign(procs.size(), std::string());
    const auto size = static_cast<int64_t>(mine.size());
    const bool inline_data = kHeadBytes + size <= std::min(cap_, kInlineBytes);
    // Kept past a timeout (abandoned_): MPI may still read it for a send that never completed.
    auto head = std::make_shared<std::string>(static_cast<size_t>(kHeadBytes), '\0');
    std::memcpy(head->data(), &size, sizeof size);
    if (inline_data) *head += mine;
    std::vector<MPI_Request> sends;
    struct Incoming {
      size_t k;           // index into procs
      int64_t want = -1;  // the message's length, once its head arrived
      int64_t got = 0;
    };
    std::vector<Incoming> pending;  // the processes still to receive from
    const auto send = [&](const char* data, int64_t bytes, int peer) {
      sends.push_back(MPI_REQUEST_NULL);
      MESHRT_MPI_CHECK(MPI_Isend(data, checked_int(bytes, "a message's byte count"), MPI_BYTE, peer,
                                 tag, comm, &sends.back()));
    };
    for (size_t k = 0; k < procs.size(); ++k) {
      if (procs[k] == rank_) {
        out[k] = mine;
        continue;
      }
      send(head->data(), static_cast<int64_t>(head->size()), procs[k]);
      if (!inline_data) {
        for (int64_t at = 0; at < size; at += cap_)
          send(mine.data() + at, std::min(cap_, size - at), procs[k]);
      }
      pending.push_back({k});
    }
    const auto malformed = [&](const Incoming& in, int n) {
      abandon(head);
      fail(cat("[distributed] ", what, ": process ", procs[in.k], " sent process ", rank_, " a ", n,
               "-byte piece of a message ", in.want < 0 ? "without its length" : "longer than",
               in.want < 0 ? "" : cat(" its ", in.want, " bytes"),
               "; run the same meshrt build, with the same calls in the same order, on every "
               "process"));
    };
    Waiting waiting(what);
    Poll poll(deadline);
    for (;;) {
      for (size_t i = 0; i < pending.size();) {
        Incoming& in = pending[i];
        std::string& dst = out[in.k];
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        MESHRT_MPI_CHECK(MPI_Improbe(procs[in.k], tag, comm, &flag, &msg, &st));
        if (!flag) {
          ++i;
          continue;
        }
        int n = 0;
        MESHRT_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &n));
        if (in.want < 0) {  // the head: the length, maybe the message
          std::string first(static_cast<size_t>(n), '\0');
          MESHRT_MPI_CHECK(MPI_Mrecv(first.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
          int64_t want = -1;
          if (n >= kHeadBytes) std::memcpy(&want, first.data(), sizeof want);
          if (n < kHeadBytes || want < n - kHeadBytes || want > kMaxExchangeBytes) malformed(in, n);
          in.want = want;
          dst.resize(static_cast<size_t>(want));
          std::memcpy(dst.data(), first.data() + kHeadBytes, static_cast<size_t>(n - kHeadBytes));
          in.got = n - kHeadBytes;
        } else {
          if (in.got + n > in.want) malformed(in, n);
          MESHRT_MPI_CHECK(MPI_Mrecv(dst.data() + in.got, n, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
          in.got += n;
        }
        if (in.got == in.want) {  // whole: the next pending process takes its place
          pending[i] = pending.back();
          pending.pop_back();
        }
      }
      int sent = 0;
      MESHRT_MPI_CHECK(MPI_Testall(checked_int(static_cast<int64_t>(sends.size()), "a send count"),
                                   sends.data(), &sent, MPI_STATUSES_IGNORE));
      if (pending.empty() && sent) return {};
      if (!poll.next()) break;
    }
    if (std::any_of(sends.begin(), sends.end(),
                    [](MPI_Request r) { return r != MPI_REQUEST_NULL; }))
      abandon(head);
    std::vector<int> missing;
    for (const Incoming& in : pending) missing.push_back(procs[in.k]);
    if (missing.empty()) missing.push_back(-1);  // received everything, a send never completed
    return missing;
  }

  // Keeps a buffer of messages that may still be in flight to the end of the process.
  void abandon(std::shared_ptr<const void> buffer) {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned_.push_back(std::move(buffer));
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
            MESHRT_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
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
  int64_t cap_;          // MESHRT_MPI_MAX_MESSAGE_BYTES: the most bytes one message carries
  bool owns_mpi_ = false;
  std::string name_;
  MPI_Comm check_ = MPI_COMM_NULL, p2p_ = MPI_COMM_NULL, exit_ = MPI_COMM_NULL;
  MPI_Group world_group_ = MPI_GROUP_NULL;
  mutable std::mutex mu_;
  std::string broken_;                                  // guarded by mu_
  std::vector<std::shared_ptr<const void>> abandoned_;  // guarded by mu_
  std::map<std::pair<std::vector<int>, int>, std::shared_future<MPI_Comm>> comms_;  // by mu_
};

MpiComm* g_comm = nullptr;  // for the exit step; owned by the process_comm registry

extern "C" void mpi_at_exit() {
  if (g_comm != nullptr) g_comm->at_exit();
}

void mark_job_broken(const std::string& why) {
  if (g_comm != nullptr) g_comm->mark_broken(why);
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
