#include "collectives/cross.h"

#include <algorithm>
#include <memory>
#include <sstream>

#include "backends/process_comm.h"
#include "collectives/direct.h"
#include "collectives/pieces.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/threads/wait.h"

namespace meshrt::coll {

namespace {

using detail::cat;

constexpr const char* kSameCalls =
    "Every process must make the same collective calls, with the same arguments, in the same "
    "order";

std::string procs_str(const std::vector<int>& procs) {
  return detail::join(procs, ", ", [](int r) { return cat(r); });
}

[[noreturn]] void fail(Session& session, Instance& inst, const std::string& message, bool broken) {
  if (broken) session.cross()->comm->mark_broken(message);
  session.fail_completed(inst, message);
  throw Error(message);
}

// Group indices of this process's members.
std::vector<int64_t> local_members(const Session& session, const Instance& inst) {
  const CrossProcess& cp = *session.cross();
  std::vector<int64_t> local;
  for (size_t k = 0; k < inst.members().size(); ++k) {
    if (cp.process_of[static_cast<size_t>(inst.members()[k])] == cp.rank)
      local.push_back(static_cast<int64_t>(k));
  }
  return local;
}

// A large reduction whose local work the process's members share (cross_finish).
bool shared_reduction(const Session& session, const Instance& inst) {
  const Call& c = inst.call();
  return is_reduction(c.kind) && !c.deterministic && input_bytes(c) > kSmallReduceBytes &&
         local_members(session, inst).size() > 1;
}

// The staging of a shared reduction: the process's sum, then the sum over processes.
struct Stage {
  std::unique_ptr<char[]> data;  // pmean's sum (other reductions sum into an output)
  std::vector<int> procs;
  int key = 0;
  std::chrono::steady_clock::time_point deadline;
  std::string error;  // written by the member making the all-reduce before it releases the others
};

}  // namespace

bool cross_done_at_arrival(const Session& session, const Instance& inst) {
  return is_reduction(inst.call().kind) && !shared_reduction(session, inst);
}

void cross_finish(Session& session, Instance& inst, int64_t me, const Shape& out_shape) {
  if (!shared_reduction(session, inst)) {
    if (!is_reduction(inst.call().kind)) direct_collective(inst, me, out_shape);
    return;
  }
  const Call& c = inst.call();
  auto& stage = *static_cast<Stage*>(inst.cross_stage().get());
  const std::vector<int64_t> local = local_members(session, inst);
  const auto L = static_cast<int64_t>(local.size());
  const int64_t li = std::find(local.begin(), local.end(), me) - local.begin();
  const Plane pl = plane_of(inst, me);
  const int64_t n = count(c.shape);
  const size_t ie = dtype_size(c.dtype);
  const Kind fold_kind = c.kind == Kind::pmean ? Kind::psum : c.kind;
  // The sum lives in the first local member's output (pmean: in the stage, whose dtype may
  // differ from the output's).
  char* const sum = c.kind == Kind::pmean ? stage.data.get() : out_ptr(inst, local.front());
  // 1. Slice li of the process's sum.
  const int64_t slice = (n + L - 1) / L;
  const int64_t lo = std::min(n, li * slice), hi = std::min(n, lo + slice);
  const int64_t at = lo * static_cast<int64_t>(ie);
  std::vector<const void*> srcs;
  for (int64_t k : local) srcs.push_back(in_ptr(inst, k) + at);
  pl.fold(fold_kind, c.dtype, c.dtype, sum + at, srcs, hi - lo);
  // 2. Every slice done: the first local member makes the one call across processes.
  std::atomic<uint32_t>& phase = inst.phase_counter();
  const auto all = static_cast<uint32_t>(L);
  if (phase.fetch_add(1, std::memory_order_acq_rel) + 1 == all) core::wake_all(phase);
  // Bounded: every local member reached finish() unless one left its body in between.
  const auto limit = stage.deadline + session.timeout();
  const auto wait_for = [&](uint32_t target) {
    for (uint32_t v; (v = phase.load(std::memory_order_acquire)) < target;) {
      core::wait_while(phase, v, std::chrono::milliseconds(100), inst.oversubscribed());
      if (std::chrono::steady_clock::now() > limit) {
        throw Error(cat("[", kind_name(c.kind), "] ", c.str(), " (", inst.where(session.names()),
                        "): a device of this process left its body without finishing its part"));
      }
    }
  };
  wait_for(all);
  if (li == 0) {
    if (!session.cross()->comm->all_reduce(stage.procs, stage.key, fold_op(fold_kind), c.dtype, sum,
                                           n, stage.deadline)) {
      stage.error = cat("[", kind_name(c.kind), "] ", c.str(), " (", inst.where(session.names()),
                        "): the all-reduce across processes ", procs_str(stage.procs),
                        " did not complete within MESHRT_COLLECTIVE_TIMEOUT after every process "
                        "had arrived; a process died or the job is overloaded");
      session.cross()->comm->mark_broken(stage.error);
    }
    phase.store(all + 1, std::memory_order_release);
    core::wake_all(phase);
  }
  wait_for(all + 1);
  if (!stage.error.empty()) throw Error(stage.error);
  // 3. Slice li of the result into every local output while it is hot (pmean: the mean, in the
  // output dtype), then wait until every slice is out: peers write this member's output.
  const size_t oe = dtype_size(out_dtype(c));
  for (int64_t k : local) {
    if (c.kind == Kind::pmean) {
      pl.mean_from_sum(c.dtype, out_dtype(c), out_ptr(inst, k) + lo * static_cast<int64_t>(oe),
                       sum + at, hi - lo, inst.size());
    } else if (k != local.front()) {
      pl.copy(out_ptr(inst, k) + at, sum + at, static_cast<size_t>(hi - lo) * ie);
    }
  }
  if (phase.fetch_add(1, std::memory_order_acq_rel) + 1 == 2 * all + 1) core::wake_all(phase);
  wait_for(2 * all + 1);
}

void cross_complete(Session& session, Instance& inst, const Plane& pl) {
  const CrossProcess& cp = *session.cross();
  backend::ProcessComm& comm = *cp.comm;
  const Call& c = inst.call();
  const std::string op = cat("[", kind_name(c.kind), "] ");
  if (!pl.host()) {
    fail(session, inst,
         cat(op, c.str(),
             ": collectives across processes run on host memory (Open MPI) only for now; the "
             "cuda platform's path across processes (NCCL communicators spanning processes) is "
             "not built yet. Use a mesh within one process on cuda, or the cpu platform"),
         false);
  }
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
  if (key64 + 1 > comm.max_tag()) {
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
  const bool small = is_reduction(c.kind) && !c.deterministic && bytes <= kSmallReduceBytes;

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
    stage->key = key;
    stage->deadline = deadline;
    inst.cross_stage() = std::move(stage);
    return;
  }
  if (is_reduction(c.kind) && !c.deterministic) {
    // Fold this process's inputs (pmean sums first, in the input dtype), one all-reduce.
    auto stage =
        std::shared_ptr<char[]>(new char[static_cast<size_t>(std::max<int64_t>(bytes, 1))]);
    std::vector<const void*> srcs;
    for (int64_t k : local) srcs.push_back(inst.slot(k).in);
    pl.fold(fold_kind, c.dtype, c.dtype, stage.get(), srcs, n);
    if (!comm.all_reduce(procs, key, fold_op(fold_kind), c.dtype, stage.get(), n, deadline))
      data_failed("all-reduce");
    const DType od = out_dtype(c);
    for (int64_t k : local) {
      if (c.kind == Kind::pmean)
        pl.mean_from_sum(c.dtype, od, out_ptr(inst, k), stage.get(), n, N);
      else
        pl.copy(out_ptr(inst, k), stage.get(), static_cast<size_t>(bytes));
    }
    return;
  }
  if (c.kind == Kind::ppermute) {  // point to point: only the pairs that cross processes move
    std::vector<backend::ProcessComm::Transfer> sends, recvs;
    std::vector<int64_t> sources;
    for (size_t i = 0; i < c.perm.size(); ++i) {
      const auto [src, dst] = c.perm[i];
      const int ps = proc_of[static_cast<size_t>(src)], pd = proc_of[static_cast<size_t>(dst)];
      if (ps == pd) continue;
      if (ps == cp.rank) {
        sends.push_back({pd, static_cast<int>(i), const_cast<void*>(inst.slot(src).in), bytes});
      } else if (pd == cp.rank) {
        recvs.push_back({ps, static_cast<int>(i), nullptr, bytes});
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
  if (!comm.all_gather(procs, key, packed.data(), all.get(), counts, deadline))
    data_failed("all-gather");
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

}  // namespace meshrt::coll
