// collectives/rendezvous.h: the rendezvous of one shard_map launch.
//
// Every collective call of a device arrives at an Instance keyed by (axes, group, sequence number
// of that device's calls on that group). The session knows what every device is doing (running
// its body, waiting in an instance, finished), so it turns misuse into errors at once:
//   * a participant whose Call differs from the others' (op, dtype, shape, axes, parameters);
//   * a device that leaves its body (returns or throws) while peers wait for it;
//   * devices waiting on each other in a cycle (a wait-for graph with no way forward);
// and, as a backstop for bodies stuck in user code, a timeout naming who never arrived.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "collectives/fingerprint.h"
#include "collectives/groups.h"
#include "core/threads/yield_lock.h"

namespace meshrt::backend {
class ProcessComm;  // backends/process_comm.h
}

namespace meshrt::coll {

// A launch whose mesh spans several processes: which process holds each mesh position. Members
// of other processes never arrive at this process's rendezvous; the member completing the local
// part of a group runs the step across processes (collectives/cross.h).
struct CrossProcess {
  backend::ProcessComm* comm = nullptr;
  std::vector<int> process_of;  // per mesh position
  int rank = 0;                 // this process
  std::string launch;           // "shard_map #3 over mesh (2, 4) ('x', 'y')": the same everywhere
};

// One participant's buffers. The shared_ptrs keep them alive as long as any peer may read them.
struct Slot {
  // The member's memory: the backend's device `device` (never null in a collective), moved
  // through its collective primitives (collectives/plane.h).
  backend::Backend* backend = nullptr;
  int device = -1;
  const void* in = nullptr;
  void* out = nullptr;
  std::shared_ptr<const void> keep_in;
  std::shared_ptr<void> keep_out;
  void* work = nullptr;  // ring algorithms' accumulation buffer (may be out)
  std::shared_ptr<void> keep_work;
  // A device platform's small direct reduction: the member's Backend::coll_begin_token (its input
  // and output are ready once the token is), waited on by the stream that folds; recycled when
  // the last copy of the slot goes.
  std::shared_ptr<void> begin_token;
};

class Session;

// One collective over one group. Slots are indexed by group index.
class Instance {
 public:
  enum State : uint32_t { kGathering = 0, kReady = 1, kFailed = 2 };

  const Call& call() const { return call_; }
  // "call #3 over ('x',) in group {cpu:0, cpu:2}" (built on demand: error paths only).
  std::string where(const std::vector<std::string>& names) const;
  int64_t size() const { return static_cast<int64_t>(members_->size()); }
  const Slot& slot(int64_t index) const { return parts_[static_cast<size_t>(index)].slot; }
  // Mesh positions by group index, and the group's place in its layout.
  const std::vector<int64_t>& members() const { return *members_; }
  const GroupLayout& layout() const { return *layout_; }
  int64_t group() const { return group_; }
  int64_t seq() const { return seq_; }
  // Whether some members belong to other processes (they count as arrived; see CrossProcess).
  bool spans_processes() const { return spans_processes_; }
  // The step across processes' staging, shared by the local members (collectives/cross.cpp).
  std::shared_ptr<void>& cross_stage() { return cross_stage_; }
  // The step across processes: a remote member's input, gathered into this process (before the
  // instance is published; `keep` keeps it alive as long as the instance).
  void set_remote_input(int64_t index, const void* in, std::shared_ptr<const void> keep) {
    parts_[static_cast<size_t>(index)].slot.in = in;
    parts_[static_cast<size_t>(index)].slot.keep_in = std::move(keep);
  }
  // The step across processes: a work buffer for member `index` (before the instance is
  // published; the library path's, when the call was set up for another algorithm).
  void set_work(int64_t index, void* work, std::shared_ptr<void> keep) {
    parts_[static_cast<size_t>(index)].slot.work = work;
    parts_[static_cast<size_t>(index)].slot.keep_work = std::move(keep);
  }
  // Drops member `index`'s references to its buffers, by that member once no peer reads or
  // writes them any more: the member's own (hot) counts, and the last member to let the instance
  // go has fewer (cold) ones to drop. Only after the instance is published.
  void release_buffers(int64_t index) {
    Slot& s = parts_[static_cast<size_t>(index)].slot;
    s.keep_in.reset();
    s.keep_out.reset();
    s.keep_work.reset();
  }
  std::atomic<uint32_t>& phase_counter() { return phase_; }  // free for two-phase algorithms
  // Per-member progress counters and sleeper counts for Transport's signal/wait.
  std::atomic<uint32_t>& progress(int64_t index) { return progress_[static_cast<size_t>(index)]; }
  std::atomic<uint32_t>& progress_sleepers(int64_t index) {
    return progress_sleepers_[static_cast<size_t>(index)];
  }
  // Member `index` has completed `unit`: publishes it and wakes peers asleep on it, if any
  // (Session::wait_progress is the other side).
  void advance(int64_t index, uint32_t unit);
  bool oversubscribed() const { return oversubscribed_; }
  // Device planes' progress tokens (backend::Backend::coll_signal): member `index` publishes the
  // token of `unit` before advancing its progress counter past it; peers read it after.
  void put_token(int64_t index, uint32_t unit, void* token);
  void* token(int64_t index, uint32_t unit) const;
  // The member whose token (unit kSmallDoneUnit) marks a small reduction queued at arrival
  // without a wait (collectives/direct.h), or -1. Written before the instance is published.
  static constexpr uint32_t kSmallDoneUnit = 0xffffffffu;
  int64_t small_done_by = -1;
  // On the host, the member whose output holds a small reduction's result (collectives/direct.h),
  // which every other member copies into its own output, or -1. Written before publishing.
  int64_t small_sum_at = -1;

  Instance() = default;
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  // Recycles the tokens: every member has fenced, or made its later work wait for them, by then.
  ~Instance();

 private:
  friend class Session;
  void set_state(uint32_t s);  // publishes and wakes sleepers, if any

  // A line of its own: members of one group run on different threads, and neighbours' parts on
  // one line would move between their cores at every arrival.
  struct alignas(64) Part {
    Slot slot;
    bool arrived = false;
  };
  int64_t member(size_t k) const { return (*members_)[k]; }
  bool arrived(size_t k) const { return parts_[k].arrived; }

  Call call_;                            // the first arrival's; every later arrival's equals it
  int64_t seq_ = 0;                      // which call of its members on this group
  const std::vector<int64_t>* members_;  // mesh positions by group index (the layout's)
  const GroupLayout* layout_ = nullptr;
  int64_t group_ = 0;
  bool spans_processes_ = false;
  std::shared_ptr<void> cross_stage_;  // written by the completer before publishing
  std::vector<Part> parts_;            // guarded by Session::mu_ until state_ leaves kGathering
  int64_t arrived_count_ = 0;          // guarded by Session::mu_
  bool registered_ = false;            // guarded by Session::mu_: a member waits in it as a sleeper
  std::string error_;                  // written before state_ = kFailed
  std::atomic<uint32_t> state_{kGathering};
  std::atomic<uint32_t> sleepers_{0};  // waiters in a futex sleep on state_
  std::atomic<uint32_t> phase_{0};
  std::unique_ptr<std::atomic<uint32_t>[]> progress_;
  std::unique_ptr<std::atomic<uint32_t>[]> progress_sleepers_;
  bool oversubscribed_ = false;
  mutable std::mutex tokens_mu_;
  std::map<std::pair<int64_t, uint32_t>, void*> tokens_;  // guarded by tokens_mu_
};

class Session {
 public:
  // names: one per mesh position ("cpu:3"); timeout: MESHRT_COLLECTIVE_TIMEOUT; cross: set when
  // the mesh spans several processes.
  Session(std::vector<std::string> names, std::chrono::milliseconds timeout, bool oversubscribed,
          std::shared_ptr<const CrossProcess> cross = nullptr);
  const std::vector<std::string>& names() const { return names_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const CrossProcess* cross() const { return cross_.get(); }

  // Registers device `pos`'s call on its group of `layout` (built for `call.axes`). Never blocks.
  // Returns the instance and whether this arrival completed it (then the caller must finish any
  // completion work and call publish()). Throws Error when the call cannot match.
  struct Arrival {
    std::shared_ptr<Instance> instance;
    bool completed;
  };
  Arrival arrive(int64_t pos, const GroupLayout& layout, const Call& call, Slot slot);
  // Makes a completed instance ready and wakes its waiters.
  void publish(Instance& inst);
  // Blocks device `pos` until `inst` is ready; throws Error if it failed.
  void wait_ready(int64_t pos, Instance& inst);
  // Blocks device `pos` until member `index` of `inst` has signalled progress `unit` (ring
  // algorithms). Part of the wait-for graph: devices waiting on each other's progress in
  // different orders (asynchronous collectives waited in different orders), or on a member that
  // left its body, are reported as errors instead of hanging; the timeout backstop applies.
  void wait_progress(int64_t pos, Instance& inst, int64_t index, uint32_t unit);
  // The device's body ended: peers still waiting for it get an error now.
  void device_finished(int64_t pos, bool threw);
  // The completer of `inst` could not finish it (the step across processes failed): its local
  // members waiting in wait_ready get `message` as their error.
  void fail_completed(Instance& inst, const std::string& message);

 private:
  enum class DevState { running, waiting, finished, threw };
  // A line of its own: neighbouring devices usually run on different threads.
  struct alignas(64) Dev {
    DevState state = DevState::running;
    Instance* waiting_on = nullptr;  // set only while asleep in wait_ready/wait_progress
    int64_t progress_index = -1;     // wait_progress: the member (group index) and
    uint32_t progress_unit = 0;      // the unit waited for; -1: wait_ready
    // Sequence numbers: the device's own (read and written by it only, outside mu_).
    std::map<const GroupLayout*, int64_t> calls_per_group;
  };
  using Key = std::tuple<const GroupLayout*, int64_t, int64_t>;  // axes' layout, group, sequence

  void fail_locked(Instance& inst, const std::string& message);
  void fail_any_locked(Instance& inst, const std::string& message);
  void timeout_locked(Instance& inst);
  void check_deadlock_locked();
  std::string describe_locked(int64_t pos) const;
  std::string members_str(const std::vector<int64_t>& pos) const;
  [[noreturn]] void throw_failed(const Instance& inst) const;

  const std::vector<std::string> names_;
  const std::chrono::milliseconds timeout_;
  const bool oversubscribed_;
  const std::shared_ptr<const CrossProcess> cross_;
  mutable core::YieldLock mu_;
  std::vector<Dev> devs_;  // guarded by mu_
  // guarded by mu_: check_deadlock_locked runs at most once per millisecond
  std::chrono::steady_clock::time_point next_deadlock_check_{};
  int64_t left_ = 0;  // guarded by mu_: devices out of their body
  using Open = std::map<Key, std::shared_ptr<Instance>>;
  Open open_;                                 // guarded by mu_: gathering or failed
  std::vector<Open::node_type> spare_nodes_;  // guarded by mu_: reused map nodes
};

}  // namespace meshrt::coll
