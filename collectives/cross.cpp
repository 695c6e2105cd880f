// A collective across processes (collectives/cross.h): the agreement check, then the data steps
// that ride on it (small reductions in the same message, ppermute's pairs, the all-gather of the
// inputs). The large reductions the local members share are cross_reduce.cpp; a device
// platform's communicators spanning processes, cross_native.cpp.
#include "collectives/cross.h"

#include <algorithm>
#include <memory>
#include <sstream>

#include "backends/process_comm.h"
#include "collectives/collective.h"
#include "collectives/cross_detail.h"
#include "collectives/direct.h"
#include "collectives/pieces.h"
#include "core/error.h"
#include "core/strings.h"

namespace meshrt::coll {

using detail::cat;

namespace {

constexpr const char* kSameCalls =
    "Every process must make the same collective calls, with the same arguments, in the same "
    "order";

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

}  // namespace cross_detail

using cross_detail::device_report;
using cross_detail::fail;
using cross_detail::local_members;
using cross_detail::open_spanning;
using cross_detail::procs_str;
using cross_detail::shared_reduction;
using cross_detail::Stage;

bool cross_done_at_arrival(const Session& session, const Instance& inst) {
  return is_reduction(inst.call().kind) && !shared_reduction(session, inst);
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
