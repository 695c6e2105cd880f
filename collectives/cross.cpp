#include "collectives/cross.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <sstream>

#include "backends/native_comm.h"
#include "backends/process_comm.h"
#include "collectives/collective.h"
#include "collectives/cross_detail.h"
#include "collectives/direct.h"
#include "collectives/pieces.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/threads/wait.h"

namespace meshrt::coll {

using detail::cat;

namespace {

constexpr const char* kSameCalls =
    "Every process must make the same collective calls, with the same arguments, in the same "
    "order";

// The pieces of the exchange across processes: each member moves its slice in pieces of this
// size, so a piece's transfer, fold and return stay in cache and the buffers stay small.
constexpr int64_t kPieceBytes = int64_t{1} << 20;

}  // namespace

namespace cross_detail {

std::string procs_str(const std::vector<int>& procs) {
  return detail::join(procs, ", ", [](int r) { return cat(r); });
}

[[noreturn]] void fail(Session& session, Instance& inst, const std::string& message, bool broken) {
  if (broken) session.cross()->comm->mark_broken(message);
  session.fail_completed(inst, message);
  throw Error(message);
}

std::vector<int64_t> local_members(const Session& session, const Instance& inst) {
  const CrossProcess& cp = *session.cross();
  std::vector<int64_t> local;
  for (size_t k = 0; k < inst.members().size(); ++k) {
    if (cp.process_of[static_cast<size_t>(inst.members()[k])] == cp.rank)
      local.push_back(static_cast<int64_t>(k));
  }
  return local;
}

bool shared_reduction(const Session& session, const Instance& inst) {
  const Call& c = inst.call();
  return is_reduction(c.kind) && !c.deterministic && input_bytes(c) > kSmallReduceBytes &&
         !local_members(session, inst).empty();
}

std::string device_report(const Instance& inst, const Plane& pl,
                          const std::vector<int64_t>& local) {
  std::vector<int> devices;
  for (int64_t k : local) devices.push_back(inst.slot(k).device);
  backend::NativeComm* nc = pl.backend()->native_comm();
  const std::string why =
      nc == nullptr ? "the platform has no collective library" : nc->unavailable(devices);
  return cat(detail::join(devices, ",", [](int d) { return cat(d); }), "|", why);
}

void open_spanning(Session& session, Instance& inst, const Plane& pl,
                   const std::vector<int>& proc_of, const std::vector<int>& procs, int key,
                   backend::ProcessComm::Deadline deadline, const std::vector<std::string>& theirs,
                   size_t header, const std::string& mine) {
  const CrossProcess& cp = *session.cross();
  const Call& c = inst.call();
  const std::string op = cat("[", kind_name(c.kind), "] ");
  auto group = std::make_shared<backend::CommGroup>();
  group->processes = proc_of;
  group->devices.assign(proc_of.size(), -1);
  std::string refused;
  for (size_t p = 0; p < procs.size(); ++p) {
    const std::string_view report =
        std::string_view(theirs[p]).substr(std::min(header, theirs[p].size()));
    const size_t bar = std::min(report.find('|'), report.size());
    std::vector<int> devs;
    for (size_t at = 0; at < bar;) {
      const size_t end = std::min(report.find(',', at), bar);
      devs.push_back(std::atoi(std::string(report.substr(at, end - at)).c_str()));
      at = end + 1;
    }
    if (bar + 1 < report.size())
      refused +=
          cat(refused.empty() ? "" : "; ", "process ", procs[p], ": ", report.substr(bar + 1));
    size_t next = 0;
    for (size_t k = 0; k < proc_of.size(); ++k) {
      if (proc_of[k] != procs[p]) continue;
      if (next < devs.size()) group->devices[k] = devs[next];
      ++next;
    }
    if (next != devs.size()) {
      fail(session, inst,
           cat(op, mine, ": process ", procs[p], " reported ", devs.size(), " devices for its ",
               next, " members of this group; every process must run the same meshrt build"),
           false);
    }
  }
  backend::NativeComm& nc = pl.native_comm();
  if (!refused.empty()) {
    fail(session, inst,
         cat(op, mine, ": ", nc.name(), " cannot serve this group across processes (", refused,
             "). Across processes every member is a ", nc.name(),
             " rank of its own GPU: run with MESHRT_CUDA_DEVICES_PER_GPU=1, or use a mesh whose "
             "groups across processes hold at most one logical device per GPU"),
         false);
  }
  if (!nc.spanning_open(*group)) {
    backend::ProcessComm& comm = *cp.comm;
    const int root = proc_of.front();
    const double timeout_s = std::chrono::duration<double>(session.timeout()).count();
    std::string token = "-";  // 'T' + the token, 'E' + why it could not be made, '-': not root
    if (root == cp.rank) {
      try {
        token = "T" + nc.new_token();
      } catch (const Error& e) {
        token = std::string("E") + e.what();
      }
    }
    std::vector<std::string> tokens;
    if (!comm.exchange(procs, key, token, tokens, deadline, mine).empty()) {
      fail(session, inst,
           cat(op, mine, ": the exchange of ", nc.name(), "'s unique id across processes ",
               procs_str(procs), " did not complete within MESHRT_COLLECTIVE_TIMEOUT (", timeout_s,
               " s) after every process had arrived; a process died or the job is overloaded"),
           true);
    }
    const std::string& got = tokens[static_cast<size_t>(
        std::lower_bound(procs.begin(), procs.end(), root) - procs.begin())];
    if (got.empty() || got[0] == '-') {
      fail(session, inst,
           cat(op, mine, ": process ", root, " holds ", nc.name(),
               " communicators for this group and this process does not (an earlier creation "
               "failed on some processes); end the job"),
           true);
    }
    if (got[0] == 'E') {
      fail(session, inst, cat(op, mine, ": process ", root, ": ", got.substr(1)), false);
    }
    try {
      nc.open_spanning(*group, cp.rank, got.substr(1));
    } catch (const Error& e) {
      fail(session, inst, cat(op, mine, ": ", e.what()), true);
    }
  }
  if (c.algo != Algo::native) {  // the call was set up for another algorithm
    Call native = c;
    native.algo = Algo::native;
    if (const int64_t wb = work_bytes(native, inst.size()); wb > 0) {
      try {
        for (int64_t k : local_members(session, inst)) {
          const Slot& s = inst.slot(k);
          std::shared_ptr<backend::Buffer> buf =
              s.backend->allocate(s.device, static_cast<size_t>(wb));
          void* data = buf->data();
          inst.set_work(k, data, std::move(buf));
        }
      } catch (const Error& e) {
        fail(session, inst, cat(op, mine, ": ", e.what()), false);
      }
    }
  }
  inst.cross_stage() = std::move(group);
}

}  // namespace cross_detail

using cross_detail::device_report;
using cross_detail::fail;
using cross_detail::local_members;
using cross_detail::open_spanning;
using cross_detail::procs_str;
using cross_detail::shared_reduction;
using cross_detail::Stage;

const backend::CommGroup& spanning_group(Instance& inst) {
  return *static_cast<const backend::CommGroup*>(inst.cross_stage().get());
}

bool cross_done_at_arrival(const Session& session, const Instance& inst) {
  return is_reduction(inst.call().kind) && !shared_reduction(session, inst);
}

// A shared reduction, for each local member li of L (at least one on every process):
//   1. fold slice li (of L) of the process's inputs into the process's sum;
//   2. (members li < S, S = the fewest members a process of the group has; after every local fold
//      when L > S) all-reduce slice li (of S) with the same member of every other process, piece
//      by piece: each process reduces part p of a piece for the group (sent to it by the others,
//      folded in process order) and sends the result back, so every process ends with the same
//      bits;
//   3. write that slice into every local output (pmean: the mean, in the output dtype);
//   4. wait until every local member is done (peers write this member's output).
// No member waits for another process's slowest member, only for its own peers.
void cross_finish(Session& session, Instance& inst, int64_t me, const Shape& out_shape) {
  if (!shared_reduction(session, inst)) {
    if (!is_reduction(inst.call().kind)) direct_collective(inst, me, out_shape);
    return;
  }
  const Call& c = inst.call();
  auto& stage = *static_cast<Stage*>(inst.cross_stage().get());
  backend::ProcessComm& comm = *session.cross()->comm;
  const std::vector<int64_t> local = local_members(session, inst);
  const auto L = static_cast<int64_t>(local.size());
  const int64_t S = stage.slices;
  const int64_t li = std::find(local.begin(), local.end(), me) - local.begin();
  const Plane pl = plane_of(inst, me);
  const int64_t n = count(c.shape);
  const auto ie = static_cast<int64_t>(dtype_size(c.dtype));
  const Kind fold_kind = c.kind == Kind::pmean ? Kind::psum : c.kind;
  // The sum lives in the first local member's output (pmean: in the stage, whose dtype may
  // differ from the output's).
  char* const sum = c.kind == Kind::pmean ? stage.data.get() : out_ptr(inst, local.front());
  std::atomic<uint32_t>& phase = inst.phase_counter();
  const auto all = static_cast<uint32_t>(L);
  // Bounded: every local member reached finish() unless one left its body in between.
  const auto limit = stage.deadline + session.timeout();
  const auto wait_for = [&](uint32_t target) {
    for (uint32_t v; (v = phase.load(std::memory_order_acquire)) < target;) {
      if (stage.failed.load(std::memory_order_acquire)) throw Error(stage.error);
      core::wait_while(phase, v, std::chrono::milliseconds(100), inst.oversubscribed());
      if (std::chrono::steady_clock::now() > limit) {
        throw Error(cat("[", kind_name(c.kind), "] ", c.str(), " (", inst.where(session.names()),
                        "): a device of this process left its body without finishing its part"));
      }
    }
    if (stage.failed.load(std::memory_order_acquire)) throw Error(stage.error);
  };
  const auto arrive = [&](uint32_t target) {
    if (phase.fetch_add(1, std::memory_order_acq_rel) + 1 == target) core::wake_all(phase);
  };
  const auto slice_of = [n](int64_t k, int64_t parts) {
    const int64_t len = (n + parts - 1) / parts;
    const int64_t lo = std::min(n, k * len);
    return std::pair{lo, std::min(n, lo + len)};
  };
  const auto fold_local = [&](int64_t a, int64_t b) {
    std::vector<const void*> srcs;
    for (int64_t k : local) srcs.push_back(in_ptr(inst, k) + a * ie);
    pl.fold(fold_kind, c.dtype, c.dtype, sum + a * ie, srcs, b - a);
  };
  const size_t oe = dtype_size(out_dtype(c));
  const auto fan_out = [&](int64_t a, int64_t b) {
    for (int64_t k : local) {
      if (c.kind == Kind::pmean) {
        pl.mean_from_sum(c.dtype, out_dtype(c), out_ptr(inst, k) + a * static_cast<int64_t>(oe),
                         sum + a * ie, b - a, inst.size());
      } else if (k != local.front()) {
        pl.copy(out_ptr(inst, k) + a * ie, sum + a * ie, static_cast<size_t>((b - a) * ie));
      }
    }
  };
  // `why`: the process layer's error; empty: a timeout.
  const auto fail_exchange = [&](const std::string& why) {
    std::call_once(stage.failed_once, [&] {
      stage.error = cat("[", kind_name(c.kind), "] ", c.str(), " (", inst.where(session.names()),
                        "): the all-reduce across processes ", procs_str(stage.procs),
                        why.empty() ? " did not complete within MESHRT_COLLECTIVE_TIMEOUT after "
                                      "every process had arrived; a process died or the job is "
                                      "overloaded"
                                    : cat(" failed: ", why));
      comm.mark_broken(stage.error);
      stage.failed.store(true, std::memory_order_release);
    });
    core::wake_all(phase);
    throw Error(stage.error);
  };
  // The exchange's slice of this member and its pieces.
  const auto [lo, hi] = li < S ? slice_of(li, S) : std::pair<int64_t, int64_t>{0, 0};
  const auto P = static_cast<int64_t>(stage.procs.size());
  const int64_t piece = std::max<int64_t>(P, kPieceBytes / ie);
  const int64_t part_max = (std::min(piece, std::max<int64_t>(hi - lo, 1)) + P - 1) / P;
  std::unique_ptr<char[]> parts(new char[static_cast<size_t>(P * part_max * ie)]);
  const int tag = static_cast<int>(2 * li);
  // One round of the exchange; every member's error reaches its peers through the stage.
  const auto send_recv = [&](const std::vector<backend::ProcessComm::Transfer>& sends,
                             const std::vector<backend::ProcessComm::Transfer>& recvs) {
    std::vector<int> missing;
    try {
      missing = comm.send_recv_group(stage.procs, stage.key, sends, recvs, stage.deadline, c.str());
    } catch (const Error& e) {
      fail_exchange(e.what());
    }
    if (!missing.empty()) fail_exchange("");
  };
  // Step 2 for sum[p0, p0 + m).
  const auto all_reduce_piece = [&](int64_t p0, int64_t m) {
    const int64_t part = (m + P - 1) / P;
    const auto range = [&](int64_t j) {
      const int64_t a = std::min(m, j * part);
      return std::pair{p0 + a, p0 + std::min(m, a + part)};
    };
    const auto [mine_lo, mine_hi] = range(stage.me);
    const int64_t mine_len = mine_hi - mine_lo;
    char* const reduced = parts.get() + stage.me * part_max * ie;
    std::vector<backend::ProcessComm::Transfer> sends, recvs;
    for (int64_t j = 0; j < P; ++j) {  // the others' parts of my sum; my part of theirs
      const auto [a, b] = range(j);
      if (j == stage.me) continue;
      sends.push_back({stage.procs[static_cast<size_t>(j)], tag, sum + a * ie, (b - a) * ie});
      recvs.push_back({stage.procs[static_cast<size_t>(j)], tag, parts.get() + j * part_max * ie,
                       mine_len * ie});
    }
    send_recv(sends, recvs);
    std::vector<const void*> srcs;
    for (int64_t j = 0; j < P; ++j)
      srcs.push_back(j == stage.me ? sum + mine_lo * ie : parts.get() + j * part_max * ie);
    pl.fold(fold_kind, c.dtype, c.dtype, reduced, srcs, mine_len);
    sends.clear();
    recvs.clear();
    for (int64_t j = 0; j < P; ++j) {  // my reduced part to the others; theirs into my sum
      const auto [a, b] = range(j);
      if (j == stage.me) continue;
      sends.push_back({stage.procs[static_cast<size_t>(j)], tag + 1, reduced, mine_len * ie});
      recvs.push_back({stage.procs[static_cast<size_t>(j)], tag + 1, sum + a * ie, (b - a) * ie});
    }
    pl.copy(sum + mine_lo * ie, reduced, static_cast<size_t>(mine_len * ie));
    send_recv(sends, recvs);
  };
  uint32_t done = all;
  if (L == S) {  // 1-3 piece by piece, each piece in cache from its fold to its last copy
    for (int64_t p0 = lo; p0 < hi; p0 += piece) {
      const int64_t p1 = std::min(hi, p0 + piece);
      fold_local(p0, p1);
      all_reduce_piece(p0, p1 - p0);
      fan_out(p0, p1);
    }
  } else {  // the folds' slices are not the exchange's: every fold first
    const auto [a, b] = slice_of(li, L);
    fold_local(a, b);
    arrive(all);
    wait_for(all);
    for (int64_t p0 = lo; p0 < hi; p0 += piece) all_reduce_piece(p0, std::min(piece, hi - p0));
    fan_out(lo, hi);
    done = 2 * all;
  }
  // 4.
  arrive(done);
  wait_for(done);
}

namespace {
void complete(Session& session, Instance& inst, const Plane& pl);
}  // namespace

void cross_complete(Session& session, Instance& inst, const Plane& pl) {
  try {
    complete(session, inst, pl);
  } catch (const Error& e) {  // the process layer's own errors too: every local member gets it
    session.fail_completed(inst, e.what());
    throw;
  }
}

namespace {
void complete(Session& session, Instance& inst, const Plane& pl) {
  const CrossProcess& cp = *session.cross();
  backend::ProcessComm& comm = *cp.comm;
  const Call& c = inst.call();
  const std::string op = cat("[", kind_name(c.kind), "] ");
  const std::vector<int64_t>& members = inst.members();
  const auto N = static_cast<int64_t>(members.size());
  std::vector<int> proc_of(members.size());
  std::vector<int> procs;
  for (size_t k = 0; k < members.size(); ++k) {
    proc_of[k] = cp.process_of[static_cast<size_t>(members[k])];
    procs.push_back(proc_of[k]);
  }
  std::sort(procs.begin(), procs.end());
  procs.erase(std::unique(procs.begin(), procs.end()), procs.end());
  // Names this group across processes: the same on every process, distinct between groups that
  // may be in flight at once (MPI tags and communicator creation).
  const int64_t key64 =
      inst.layout().axes_key * static_cast<int64_t>(inst.layout().members.size()) + inst.group();
  // Keys stay below max_tag(), the checkpoint barrier's tag on the same channel.
  if (key64 + 1 >= comm.max_tag()) {
    fail(session, inst,
         cat(op, c.str(),
             ": the mesh has too many axes or groups to name this group across "
             "processes within the MPI library's tag range (",
             comm.max_tag(), "); use fewer mesh axes or devices"),
         false);
  }
  const int key = static_cast<int>(key64) + 1;  // tag 0 is initialize()'s
  const auto deadline = std::chrono::steady_clock::now() + session.timeout();
  const double timeout_s = std::chrono::duration<double>(session.timeout()).count();

  const int64_t bytes = input_bytes(c);
  const int64_t n = count(c.shape);
  std::vector<int64_t> local;  // group indices of this process's members
  for (int64_t k = 0; k < N; ++k) {
    if (proc_of[static_cast<size_t>(k)] == cp.rank) local.push_back(k);
  }
  const Kind fold_kind = c.kind == Kind::pmean ? Kind::psum : c.kind;
  // A small reduction sends its process's partial result with the description: one round trip.
  const bool small =
      pl.host() && is_reduction(c.kind) && !c.deterministic && bytes <= kSmallReduceBytes;

  // 1. Agreement: every process of the group describes the call it makes.
  const std::string mine = cat(cp.launch, ", ", inst.where(session.names()), ": ", c.str());
  std::string message = mine;
  // The partial result starts 16-byte aligned in the message (descriptions hold no NUL).
  const size_t header = (mine.size() + 1 + 15) / 16 * 16;
  if (small) {
    std::vector<const void*> srcs;
    for (int64_t k : local) srcs.push_back(inst.slot(k).in);
    message.resize(header + static_cast<size_t>(bytes), '\0');
    pl.fold(fold_kind, c.dtype, c.dtype, message.data() + header, srcs, n);
  } else if (!pl.host()) {  // what the library path needs to know of every process
    message.resize(header, '\0');
    message += device_report(inst, pl, local);
  }
  std::vector<std::string> theirs;
  std::vector<int> missing = comm.exchange(procs, key, message, theirs, deadline, mine);
  if (!missing.empty()) {
    std::vector<std::string> devs;
    for (size_t k = 0; k < members.size(); ++k) {
      if (std::find(missing.begin(), missing.end(), proc_of[k]) != missing.end())
        devs.push_back(session.names()[static_cast<size_t>(members[k])]);
    }
    fail(session, inst,
         cat(op, mine, " timed out after ", timeout_s,
             " s (MESHRT_COLLECTIVE_TIMEOUT): process(es) ", procs_str(missing), " (holding ",
             detail::join(devs, ", ", [](const std::string& s) { return s; }),
             ") never made this call (they stopped calling, are stuck, or died). ", kSameCalls,
             "; raise MESHRT_COLLECTIVE_TIMEOUT if their work is just slow"),
         true);
  }
  std::vector<std::string_view> described(theirs.size());
  for (size_t k = 0; k < theirs.size(); ++k)
    described[k] = std::string_view(theirs[k]).substr(0, theirs[k].find('\0'));
  if (std::any_of(described.begin(), described.end(),
                  [&](std::string_view s) { return s != mine; })) {
    std::ostringstream os;
    os << op << "processes disagree on a collective across processes: ";
    for (size_t k = 0; k < procs.size(); ++k)
      os << (k ? "; " : "") << "process " << procs[k] << " called " << described[k];
    os << ". " << kSameCalls;
    fail(session, inst, os.str(), false);
  }

  // 2. The data.
  if (!pl.host()) {  // a device platform: its library, over communicators spanning processes
    open_spanning(session, inst, pl, proc_of, procs, key, deadline, theirs, header, mine);
    return;
  }
  if (small) {  // the partial results arrived with the descriptions: fold them in process order
    std::vector<const void*> partials;
    for (const std::string& t : theirs) partials.push_back(t.data() + header);
    const DType od = out_dtype(c);
    std::vector<char> sum(static_cast<size_t>(bytes));
    pl.fold(fold_kind, c.dtype, c.dtype, sum.data(), partials, n);
    for (int64_t k : local) {
      if (c.kind == Kind::pmean)
        pl.mean_from_sum(c.dtype, od, out_ptr(inst, k), sum.data(), n, N);
      else
        pl.copy(out_ptr(inst, k), sum.data(), static_cast<size_t>(bytes));
    }
    return;
  }
  const auto data_failed = [&](const char* what) {
    fail(session, inst,
         cat(op, mine, ": the ", what, " across processes ", procs_str(procs),
             " did not complete within MESHRT_COLLECTIVE_TIMEOUT (", timeout_s,
             " s) after every process had arrived; a process died or the job is overloaded"),
         true);
  };
  if (shared_reduction(session, inst)) {  // the local members share the rest (cross_finish)
    auto stage = std::make_shared<Stage>();
    if (c.kind == Kind::pmean) stage->data = std::make_unique<char[]>(static_cast<size_t>(bytes));
    stage->procs = procs;
    stage->me =
        static_cast<int>(std::lower_bound(procs.begin(), procs.end(), cp.rank) - procs.begin());
    std::vector<int64_t> per_proc(procs.size(), 0);
    for (int p : proc_of)
      ++per_proc[static_cast<size_t>(std::lower_bound(procs.begin(), procs.end(), p) -
                                     procs.begin())];
    stage->slices = *std::min_element(per_proc.begin(), per_proc.end());
    stage->key = key;
    stage->deadline = deadline;
    // The group's communicator exists before its members use it from several threads.
    if (!comm.open_group(procs, key, deadline)) data_failed("communicator's creation");
    inst.cross_stage() = std::move(stage);
    return;
  }
  if (c.kind == Kind::ppermute) {  // point to point: only the pairs that cross processes move
    std::vector<backend::ProcessComm::Transfer> sends, recvs;
    std::vector<int64_t> sources;
    // Pairs in perm order on both sides: tags may repeat (wrap) without mixing transfers.
    const auto tag_of = [&](size_t i) {
      return static_cast<int>(static_cast<int64_t>(i) % comm.max_tag());
    };
    for (size_t i = 0; i < c.perm.size(); ++i) {
      const auto [src, dst] = c.perm[i];
      const int ps = proc_of[static_cast<size_t>(src)], pd = proc_of[static_cast<size_t>(dst)];
      if (ps == pd) continue;
      if (ps == cp.rank) {
        sends.push_back({pd, tag_of(i), const_cast<void*>(inst.slot(src).in), bytes});
      } else if (pd == cp.rank) {
        recvs.push_back({ps, tag_of(i), nullptr, bytes});
        sources.push_back(src);
      }
    }
    auto buf = std::shared_ptr<char[]>(new char[static_cast<size_t>(
        std::max<int64_t>(1, bytes * static_cast<int64_t>(recvs.size())))]);
    for (size_t r = 0; r < recvs.size(); ++r) {
      recvs[r].data = buf.get() + static_cast<int64_t>(r) * bytes;
      inst.set_remote_input(sources[r], recvs[r].data, std::shared_ptr<const void>(buf, buf.get()));
    }
    if (!comm.send_recv_group(procs, key, sends, recvs, deadline, mine).empty())
      data_failed("exchange");
    return;
  }
  // Every member's input, gathered process by process (each process's members in group order).
  std::vector<int64_t> counts(procs.size(), 0), first(procs.size(), 0);
  std::vector<int64_t> slot_in_proc(members.size());
  for (size_t k = 0; k < members.size(); ++k) {
    const auto p = static_cast<size_t>(std::lower_bound(procs.begin(), procs.end(), proc_of[k]) -
                                       procs.begin());
    slot_in_proc[k] = counts[p] / std::max<int64_t>(bytes, 1);
    counts[p] += bytes;
  }
  for (size_t p = 1; p < procs.size(); ++p) first[p] = first[p - 1] + counts[p - 1];
  const int64_t total = first.back() + counts.back();
  std::vector<char> packed(
      static_cast<size_t>(std::max<int64_t>(bytes, 1) * static_cast<int64_t>(local.size())));
  for (size_t i = 0; i < local.size(); ++i)
    pl.copy(packed.data() + static_cast<int64_t>(i) * bytes, inst.slot(local[i]).in,
            static_cast<size_t>(bytes));
  auto all = std::shared_ptr<char[]>(new char[static_cast<size_t>(std::max<int64_t>(total, 1))]);
  bool gathered = false;
  try {
    gathered = comm.all_gather(procs, key, packed.data(), all.get(), counts, deadline);
  } catch (const Error& e) {
    fail(session, inst, cat(op, mine, ": ", e.what()), true);
  }
  if (!gathered) data_failed("all-gather");
  for (size_t k = 0; k < members.size(); ++k) {
    if (proc_of[k] == cp.rank) continue;
    const auto p = static_cast<size_t>(std::lower_bound(procs.begin(), procs.end(), proc_of[k]) -
                                       procs.begin());
    inst.set_remote_input(static_cast<int64_t>(k), all.get() + first[p] + slot_in_proc[k] * bytes,
                          std::shared_ptr<const void>(all, all.get()));
  }
  if (is_reduction(c.kind)) {  // deterministic: fold every input in group order, as direct
    std::vector<const void*> srcs(members.size());
    for (size_t k = 0; k < members.size(); ++k) srcs[k] = inst.slot(static_cast<int64_t>(k)).in;
    const DType od = out_dtype(c);
    char* out0 = out_ptr(inst, local.front());
    pl.fold(c.kind, c.dtype, od, out0, srcs, n);
    const size_t out_bytes = static_cast<size_t>(n) * dtype_size(od);
    for (size_t i = 1; i < local.size(); ++i) pl.copy(out_ptr(inst, local[i]), out0, out_bytes);
  }
}

}  // namespace

}  // namespace meshrt::coll
