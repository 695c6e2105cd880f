#include "collectives/rendezvous.h"

#include <chrono>
#include <map>
#include <sstream>

#include "backends/backend.h"
#include "core/error.h"
#include "core/threads/fiber_executor.h"
#include "core/threads/wait.h"

namespace meshrt::coll {

namespace {

std::string axes_str(const std::vector<std::string>& axes) {
  std::string s = "(";
  for (size_t i = 0; i < axes.size(); ++i) {
    s += i ? ", '" : "'";  // appended piecewise: GCC 12 warns (-Wrestrict) on "lit" + str chains
    s += axes[i];
    s += "'";
  }
  return s + (axes.size() == 1 ? ",)" : ")");
}

constexpr const char* kSameOrder =
    "every device of a group must make the same collective calls, with the same arguments, in "
    "the same order (and wait for asynchronous ones in the same order)";

}  // namespace

std::string Instance::where(const std::vector<std::string>& names) const {
  std::string s =
      "call #" + std::to_string(seq_ + 1) + " over " + axes_str(*call_.axes) + " in group {";
  for (size_t i = 0; i < members_->size(); ++i) {
    if (i) s += ", ";
    s += names[static_cast<size_t>((*members_)[i])];
  }
  return s + "}";
}

void Instance::advance(int64_t index, uint32_t unit) {
  progress(index).store(unit, std::memory_order_seq_cst);
  if (progress_sleepers(index).load(std::memory_order_seq_cst) > 0) core::wake_all(progress(index));
}

void Instance::put_token(int64_t index, uint32_t unit, void* token) {
  std::lock_guard<std::mutex> lock(tokens_mu_);
  tokens_[{index, unit}] = token;
}

void* Instance::token(int64_t index, uint32_t unit) const {
  std::lock_guard<std::mutex> lock(tokens_mu_);
  auto it = tokens_.find({index, unit});
  return it == tokens_.end() ? nullptr : it->second;
}

Instance::~Instance() {
  for (auto& [key, token] : tokens_) {
    const Slot& s = parts_[static_cast<size_t>(key.first)].slot;
    if (s.backend != nullptr) s.backend->coll_release_token(s.device, token);
  }
}

void Instance::set_state(uint32_t s) {
  state_.store(s, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) core::wake_all(state_);
}

Session::Session(std::vector<std::string> names, std::chrono::milliseconds timeout,
                 bool oversubscribed, std::shared_ptr<const CrossProcess> cross)
    : names_(std::move(names)),
      timeout_(timeout),
      oversubscribed_(oversubscribed),
      cross_(std::move(cross)),
      devs_(names_.size()) {}

void Session::fail_completed(Instance& inst, const std::string& message) {
  std::lock_guard<core::YieldLock> lock(mu_);
  if (inst.state_.load(std::memory_order_relaxed) == Instance::kFailed) return;
  inst.error_ = message;
  inst.set_state(Instance::kFailed);
}

std::string Session::members_str(const std::vector<int64_t>& pos) const {
  std::string s;
  for (size_t i = 0; i < pos.size(); ++i)
    s += (i ? ", " : "") + names_[static_cast<size_t>(pos[i])];
  return s;
}

// What device `pos` is doing, for error messages.
std::string Session::describe_locked(int64_t pos) const {
  const Dev& d = devs_[static_cast<size_t>(pos)];
  switch (d.state) {
    case DevState::running:
      return names_[static_cast<size_t>(pos)] + " is running its body (not in a collective)";
    case DevState::finished:
      return names_[static_cast<size_t>(pos)] + " has returned from its body";
    case DevState::threw:
      return names_[static_cast<size_t>(pos)] + " has thrown out of its body";
    case DevState::waiting: {
      const Instance& w = *d.waiting_on;
      if (d.progress_index >= 0) {
        const int64_t m = w.member(static_cast<size_t>(d.progress_index));
        return names_[static_cast<size_t>(pos)] + " waits in " + w.call_.str() + " (" +
               w.where(names_) + ") for " + names_[static_cast<size_t>(m)] +
               " to send its part (step " + std::to_string(d.progress_unit) + ")";
      }
      std::vector<int64_t> missing;
      for (size_t i = 0; i < w.members_->size(); ++i) {
        if (!w.arrived(i)) missing.push_back(w.member(i));
      }
      return names_[static_cast<size_t>(pos)] + " waits in " + w.call_.str() + " (" +
             w.where(names_) + ") for " + members_str(missing);
    }
  }
  return "";
}

void Session::fail_locked(Instance& inst, const std::string& message) {
  // Complete instances never fail: their completer is about to publish them.
  if (inst.state_.load(std::memory_order_relaxed) != Instance::kGathering ||
      inst.arrived_count_ == inst.size()) {
    return;
  }
  inst.error_ = message;
  for (int64_t m : *inst.members_) {
    Dev& d = devs_[static_cast<size_t>(m)];
    if (d.waiting_on == &inst) {
      d.state = DevState::running;
      d.waiting_on = nullptr;
    }
  }
  inst.set_state(Instance::kFailed);
}

void Session::throw_failed(const Instance& inst) const { throw Error(inst.error_); }

// A published instance whose data movement cannot finish (ring progress): its members are in
// finish() and see the failure at their next progress wait.
void Session::fail_any_locked(Instance& inst, const std::string& message) {
  const uint32_t st = inst.state_.load(std::memory_order_relaxed);
  if (st == Instance::kFailed) return;
  if (st == Instance::kGathering) {
    fail_locked(inst, message);
    return;
  }
  inst.error_ = message;
  inst.set_state(Instance::kFailed);
}

Session::Arrival Session::arrive(int64_t pos, const GroupLayout& layout, const Call& call,
                                 Slot slot) {
  // The sequence number before the lock: only this device touches its counters.
  const int64_t seq = devs_[static_cast<size_t>(pos)].calls_per_group[&layout]++;
  std::lock_guard<core::YieldLock> lock(mu_);
  const int64_t group = layout.group_of[static_cast<size_t>(pos)];
  const int64_t index = layout.index_of[static_cast<size_t>(pos)];
  Key key{&layout, group, seq};
  auto it = open_.find(key);
  std::shared_ptr<Instance> inst;
  if (it == open_.end()) {
    inst = std::make_shared<Instance>();
    inst->call_ = call;
    inst->seq_ = seq;
    inst->members_ = &layout.members[static_cast<size_t>(group)];
    inst->layout_ = &layout;
    inst->group_ = group;
    inst->parts_.resize(inst->members_->size());
    if (cross_) {  // members in other processes never arrive here: they count as arrived
      for (size_t k = 0; k < inst->parts_.size(); ++k) {
        if (cross_->process_of[static_cast<size_t>(inst->member(k))] == cross_->rank) continue;
        inst->parts_[k].arrived = true;
        ++inst->arrived_count_;
        inst->spans_processes_ = true;
      }
    }
    // ring progress; native (and a device platform's groups across processes): "launched" marks
    if (call.algo != Algo::direct || inst->spans_processes_) {
      inst->progress_ = std::make_unique<std::atomic<uint32_t>[]>(inst->members_->size());
      inst->progress_sleepers_ = std::make_unique<std::atomic<uint32_t>[]>(inst->members_->size());
    }
    inst->oversubscribed_ = oversubscribed_;
    if (spare_nodes_.empty()) {
      it = open_.emplace(key, inst).first;
    } else {
      Open::node_type node = std::move(spare_nodes_.back());
      spare_nodes_.pop_back();
      node.key() = key;
      node.mapped() = inst;
      it = open_.insert(std::move(node)).position;
    }
  } else {
    inst = it->second;
  }
  if (inst->state_.load(std::memory_order_relaxed) == Instance::kFailed) throw_failed(*inst);
  const auto i = static_cast<size_t>(index);
  if (!(call == inst->call_)) {
    // Every arrival so far matched the first one, so they all called call_.
    std::ostringstream os;
    os << "[" << kind_name(call.kind) << "] mismatched collectives in " << inst->where(names_)
       << ": ";
    for (size_t k = 0; k < inst->members_->size(); ++k) {
      os << (k ? "; " : "") << names_[static_cast<size_t>(inst->member(k))];
      if (k == i)
        os << " called " << call.str();
      else if (inst->arrived(k))
        os << " called " << inst->call_.str();
      else
        os << " has not arrived";
    }
    os << ". " << kSameOrder;
    fail_locked(*inst, os.str());  // this arrival is not counted, so the instance is incomplete
    throw_failed(*inst);
  }
  inst->parts_[i].arrived = true;
  inst->parts_[i].slot = std::move(slot);
  ++inst->arrived_count_;
  // A member that already left its body can never arrive (scanned only once some device left,
  // so an arrival costs O(1) while every body is still running).
  for (size_t k = 0; left_ > 0 && k < inst->members_->size(); ++k) {
    const Dev& d = devs_[static_cast<size_t>(inst->member(k))];
    if (!inst->arrived(k) && (d.state == DevState::finished || d.state == DevState::threw)) {
      fail_locked(*inst, "[" + std::string(kind_name(call.kind)) + "] " +
                             names_[static_cast<size_t>(inst->member(k))] +
                             (d.state == DevState::threw ? " threw out of" : " returned from") +
                             " its shard_map body without making " + inst->call_.str() + " (" +
                             inst->where(names_) + "); " + kSameOrder);
      throw_failed(*inst);
    }
  }
  const bool complete = inst->arrived_count_ == inst->size();
  if (complete) {
    spare_nodes_.push_back(open_.extract(it));
    spare_nodes_.back().mapped().reset();
    // Only members asleep in wait_ready are marked waiting on it: none, usually (4096 members'
    // states are 4096 cache misses under the lock).
    for (size_t k = 0; inst->registered_ && k < inst->members_->size(); ++k) {
      Dev& d = devs_[static_cast<size_t>(inst->member(k))];
      if (d.waiting_on == inst.get() && d.progress_index < 0) {
        d.state = DevState::running;  // released as soon as the data is published
        d.waiting_on = nullptr;
      }
    }
  }
  return {std::move(inst), complete};
}

void Session::publish(Instance& inst) { inst.set_state(Instance::kReady); }

void Session::timeout_locked(Instance& inst) {
  std::ostringstream os;
  os << "[" << kind_name(inst.call_.kind) << "] " << inst.call_.str() << " (" << inst.where(names_)
     << ") timed out after " << std::chrono::duration<double>(timeout_).count()
     << " s (MESHRT_COLLECTIVE_TIMEOUT): ";
  std::vector<int64_t> missing;
  for (size_t k = 0; k < inst.members_->size(); ++k) {
    if (!inst.arrived(k)) missing.push_back(inst.member(k));
  }
  os << members_str(missing) << " never arrived (";
  for (size_t k = 0; k < missing.size(); ++k) os << (k ? "; " : "") << describe_locked(missing[k]);
  os << "). Raise MESHRT_COLLECTIVE_TIMEOUT if their work is just slow.";
  if (core::fiber_executors_in_use()) {
    os << " Devices run as fibers sharing a thread per core (MESHRT_CPU_EXECUTOR=auto|fibers): a "
          "body "
          "blocked outside meshrt (sleep, a lock, I/O) also stalls the devices sharing its thread; "
          "MESHRT_CPU_EXECUTOR=threads gives each device its own thread.";
  }
  fail_locked(inst, os.str());
}

void Session::wait_ready(int64_t pos, Instance& inst) {
  // Fast path, no lock: peers usually arrive within the spin budget. Until this device sleeps it
  // counts as running, which can only delay deadlock reports, never cause a false one. On a fiber
  // the budget grows with the devices sharing its thread: with 2048 per worker a group gathers in
  // milliseconds, and a waiter resumed early only to register here would cost a second switch into
  // its cold stack per device and collective.
  const auto budget = core::cooperative_wait_budget(core::kSpinBudget);
  if (inst.state_.load(std::memory_order_acquire) == Instance::kGathering &&
      !core::spin_while(inst.state_, Instance::kGathering, budget, oversubscribed_)) {
    const auto start = std::chrono::steady_clock::now() - budget;
    {
      std::lock_guard<core::YieldLock> lock(mu_);
      if (inst.state_.load(std::memory_order_acquire) == Instance::kGathering &&
          inst.arrived_count_ < inst.size()) {
        Dev& me = devs_[static_cast<size_t>(pos)];
        me.state = DevState::waiting;
        me.waiting_on = &inst;
        inst.registered_ = true;
      }
    }
    inst.sleepers_.fetch_add(1, std::memory_order_seq_cst);
    // Short slices first so a deadlock is reported within milliseconds; each slice that ends
    // without progress re-runs the deadlock check and the timeout backstop.
    auto slice = std::chrono::milliseconds(2);
    while (!core::sleep_while(inst.state_, Instance::kGathering, slice)) {
      std::lock_guard<core::YieldLock> lock(mu_);
      if (inst.state_.load(std::memory_order_acquire) != Instance::kGathering) break;
      check_deadlock_locked();
      if (inst.state_.load(std::memory_order_acquire) != Instance::kGathering) break;
      // A complete instance is being finished by its completer (across processes: bounded by
      // its own deadline), which publishes or fails it.
      if (inst.arrived_count_ < inst.size() &&
          std::chrono::steady_clock::now() - start >= timeout_) {
        timeout_locked(inst);
        break;
      }
      slice = std::min(slice * 2, std::chrono::milliseconds(100));
    }
    inst.sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }
  if (inst.state_.load(std::memory_order_acquire) == Instance::kFailed) throw_failed(inst);
}

void Session::wait_progress(int64_t pos, Instance& inst, int64_t index, uint32_t unit) {
  std::atomic<uint32_t>& c = inst.progress(index);
  uint32_t v = c.load(std::memory_order_acquire);
  if (v >= unit) return;
  // Fast path: the neighbour is usually a piece ahead or about to be.
  for (int tries = 0; v < unit && tries < 4; ++tries) {
    core::spin_while(c, v, core::kSpinBudget, oversubscribed_);
    v = c.load(std::memory_order_acquire);
  }
  if (v >= unit) return;
  const auto start = std::chrono::steady_clock::now();
  {
    std::lock_guard<core::YieldLock> lock(mu_);
    if (inst.state_.load(std::memory_order_acquire) == Instance::kFailed) throw_failed(inst);
    Dev& me = devs_[static_cast<size_t>(pos)];
    me.state = DevState::waiting;
    me.waiting_on = &inst;
    me.progress_index = index;
    me.progress_unit = unit;
  }
  inst.progress_sleepers(index).fetch_add(1, std::memory_order_seq_cst);
  auto slice = std::chrono::milliseconds(2);
  bool failed = false;
  while ((v = c.load(std::memory_order_acquire)) < unit) {
    if (core::sleep_while(c, v, slice)) continue;
    std::lock_guard<core::YieldLock> lock(mu_);
    if (c.load(std::memory_order_acquire) >= unit) break;
    if (inst.state_.load(std::memory_order_acquire) != Instance::kFailed) check_deadlock_locked();
    if (inst.state_.load(std::memory_order_acquire) == Instance::kFailed) {
      failed = true;
      break;
    }
    const int64_t m = inst.member(static_cast<size_t>(index));
    const DevState ms = devs_[static_cast<size_t>(m)].state;
    if (ms == DevState::finished || ms == DevState::threw) {  // it left without completing its part
      fail_any_locked(inst, "[" + std::string(kind_name(inst.call_.kind)) + "] " +
                                names_[static_cast<size_t>(m)] +
                                (ms == DevState::threw ? " threw out of" : " returned from") +
                                " its shard_map body before completing its part of " +
                                inst.call_.str() + " (" + inst.where(names_) + "), which " +
                                names_[static_cast<size_t>(pos)] + " waits for");
      failed = true;
      break;
    }
    if (std::chrono::steady_clock::now() - start >= timeout_) {
      std::ostringstream os;
      os << "[" << kind_name(inst.call_.kind) << "] " << inst.call_.str() << " ("
         << inst.where(names_) << ") timed out after "
         << std::chrono::duration<double>(timeout_).count()
         << " s (MESHRT_COLLECTIVE_TIMEOUT): " << describe_locked(pos) << ", and "
         << describe_locked(m) << ". Raise MESHRT_COLLECTIVE_TIMEOUT if their work is just slow.";
      fail_any_locked(inst, os.str());
      failed = true;
      break;
    }
    slice = std::min(slice * 2, std::chrono::milliseconds(100));
  }
  inst.progress_sleepers(index).fetch_sub(1, std::memory_order_seq_cst);
  {
    std::lock_guard<core::YieldLock> lock(mu_);
    Dev& me = devs_[static_cast<size_t>(pos)];
    if (me.state == DevState::waiting) me.state = DevState::running;
    me.waiting_on = nullptr;
    me.progress_index = -1;
  }
  if (failed) throw_failed(inst);
}

void Session::device_finished(int64_t pos, bool threw) {
  std::lock_guard<core::YieldLock> lock(mu_);
  Dev& me = devs_[static_cast<size_t>(pos)];
  me.state = threw ? DevState::threw : DevState::finished;
  ++left_;
  me.waiting_on = nullptr;
  for (auto& [key, inst] : open_) {
    for (size_t k = 0; k < inst->members_->size(); ++k) {
      if (inst->member(k) != pos || inst->arrived(k)) continue;
      std::vector<int64_t> waiting;
      for (size_t j = 0; j < inst->members_->size(); ++j) {
        if (inst->arrived(j)) waiting.push_back(inst->member(j));
      }
      fail_locked(*inst, "[" + std::string(kind_name(inst->call_.kind)) + "] " +
                             names_[static_cast<size_t>(pos)] +
                             (threw ? " threw out of" : " returned from") +
                             " its shard_map body while " + members_str(waiting) +
                             (waiting.size() == 1 ? " waits" : " wait") + " for it in " +
                             inst->call_.str() + " (" + inst->where(names_) + "); " + kSameOrder);
    }
  }
}

// A waiting device can make progress only if every member missing from its instance can: a
// running device might still arrive; a waiting one only if its own instance can complete. What
// cannot be shown live this way is deadlocked.
void Session::check_deadlock_locked() {
  // Every sleeping waiter calls this when a slice of its sleep ends: with many devices waiting
  // on one slow collective (256 simulated devices on 2 cores), one check per millisecond is
  // plenty, and a deadlock is still reported within a few slices.
  const auto now = std::chrono::steady_clock::now();
  if (now < next_deadlock_check_) return;
  next_deadlock_check_ = now + std::chrono::milliseconds(1);
  const size_t n = devs_.size();
  std::vector<bool> live(n);
  for (size_t p = 0; p < n; ++p) live[p] = devs_[p].state == DevState::running;
  // Waiters of one instance's rendezvous share the answer within a pass (every member arrived or
  // live): computed once per instance, so a pass is O(devices), not O(devices x members).
  std::map<const Instance*, bool> gathered;
  for (bool changed = true; changed;) {
    changed = false;
    gathered.clear();
    for (size_t p = 0; p < n; ++p) {
      if (live[p] || devs_[p].state != DevState::waiting) continue;
      const Instance& w = *devs_[p].waiting_on;
      bool ok = true;
      if (devs_[p].progress_index >=
          0) {  // live once the member's progress is there, or if it can get there
        const auto k = static_cast<size_t>(devs_[p].progress_index);
        ok = w.progress_[k].load(std::memory_order_acquire) >= devs_[p].progress_unit ||
             live[static_cast<size_t>(w.member(k))];
      } else {
        auto it = gathered.find(&w);
        if (it == gathered.end()) {
          bool all = true;
          for (size_t k = 0; k < w.members_->size() && all; ++k) {
            if (!w.arrived(k) && !live[static_cast<size_t>(w.member(k))]) all = false;
          }
          it = gathered.emplace(&w, all).first;
        }
        ok = it->second;
      }
      if (ok) live[p] = changed = true;
    }
  }
  std::vector<int64_t> stuck;
  for (size_t p = 0; p < n; ++p) {
    if (devs_[p].state == DevState::waiting && !live[p]) stuck.push_back(static_cast<int64_t>(p));
  }
  if (stuck.empty()) return;
  std::ostringstream os;
  os << "[" << kind_name(devs_[static_cast<size_t>(stuck[0])].waiting_on->call_.kind)
     << "] deadlock: devices wait for each other and none can proceed: ";
  for (size_t k = 0; k < stuck.size(); ++k) os << (k ? "; " : "") << describe_locked(stuck[k]);
  os << ". " << kSameOrder;
  const std::string message = os.str();
  std::vector<Instance*> instances;
  for (int64_t p : stuck) instances.push_back(devs_[static_cast<size_t>(p)].waiting_on);
  for (Instance* inst : instances) fail_any_locked(*inst, message);
}

}  // namespace meshrt::coll
