// A large reduction across processes on host memory, its work shared by each process's members
// (collectives/cross.h, cross_finish).
#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "backends/process_comm.h"
#include "collectives/collective.h"
#include "collectives/cross.h"
#include "collectives/cross_detail.h"
#include "collectives/direct.h"
#include "collectives/pieces.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/threads/wait.h"

namespace meshrt::coll {

using cross_detail::local_members;
using cross_detail::procs_str;
using cross_detail::shared_reduction;
using cross_detail::Stage;
using detail::cat;

namespace {

// The pieces of the exchange across processes: each member moves its slice in pieces of this
// size, so a piece's transfer, fold and return stay in cache and the buffers stay small.
constexpr int64_t kPieceBytes = int64_t{1} << 20;

}  // namespace

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

}  // namespace meshrt::coll
