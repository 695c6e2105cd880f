// backends/comm_cache.h: a vendor collective library's communicators, one set per ordered device
// group (a communicator per member, rank = group index), created whole on first use, bounded,
// and destroyed only when no member can still use them. Shared by the NativeComm
// implementations (NCCL now, MPI next); free of vendor headers, so cpu tests check the policy.
//
// Creating a group's set is all-or-nothing: a failure throws and caches nothing, so the next
// call retries. Past `capacity` sets, the least recently used *idle* set is destroyed: no member
// holds a lease on it, every member has launched as many calls on it as the others (none is
// mid-collective), and each member's device has fenced its stream since its last launch (no work
// in flight). Because a set is always created for all members at once, a set destroyed and later
// re-created is consistent for every member. When no set is idle the cache stays over capacity
// until one is. create and destroy run on the calling thread; destroy never under the lock.
//
// Thread-safe: members acquire leases from their own executor threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"

namespace meshrt::backend {

template <class Comm>
class CommCache {
  struct Entry;

 public:
  struct Hooks {
    // The communicators of `group` (device indices in group order), one per member in group
    // order. Throws on failure. Called under the cache's lock: members of the group wait for it.
    std::function<std::vector<Comm>(const std::vector<int>& group)> create;
    // Destroys one group's communicators (outside the cache's lock).
    std::function<void(const std::vector<int>& group, std::vector<Comm>& comms)> destroy;
    // How many stream fences device `d` has completed; work a member launched is done once its
    // device has fenced after the launch.
    std::function<uint64_t(int d)> fences;
  };

  CommCache(size_t capacity, Hooks hooks) : capacity_(capacity), hooks_(std::move(hooks)) {}
  CommCache(const CommCache&) = delete;
  CommCache& operator=(const CommCache&) = delete;

  // One member's use of its group's communicator, from lookup until the library call is queued;
  // the set cannot be destroyed while a lease on it is held.
  class Lease {
   public:
    Lease(Lease&& o) noexcept : cache_(o.cache_), entry_(std::move(o.entry_)), rank_(o.rank_) {
      o.cache_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (cache_ != nullptr) cache_->release(*entry_, rank_, launched_);
    }
    Comm comm() const { return entry_->comms[rank_]; }
    int rank() const { return static_cast<int>(rank_); }
    // The library call was queued on the member's stream (counted once the lease ends).
    void launched() { launched_ = true; }

   private:
    friend class CommCache;
    Lease(CommCache* c, std::shared_ptr<Entry> e, size_t rank)
        : cache_(c), entry_(std::move(e)), rank_(rank) {}
    CommCache* cache_;
    std::shared_ptr<Entry> entry_;
    size_t rank_;
    bool launched_ = false;
  };

  // The communicator of `device` (a member of `group`) for one library call.
  Lease acquire(const std::vector<int>& group, int device) {
    size_t rank = 0;
    while (rank < group.size() && group[rank] != device) ++rank;
    if (rank == group.size())
      throw Error("[native] a device called for a group it is not in; this is a meshrt bug");
    std::vector<std::shared_ptr<Entry>> retired;
    std::shared_ptr<Entry> e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = entries_.find(group);
      if (it == entries_.end()) {
        auto fresh = std::make_shared<Entry>();
        fresh->comms = hooks_.create(group);  // throws: nothing cached
        fresh->group = group;
        fresh->launches.assign(group.size(), 0);
        fresh->fence_mark.assign(group.size(), 0);
        it = entries_.emplace(group, std::move(fresh)).first;
        retire_locked(it->second.get(), retired);
      }
      e = it->second;
      e->last_use = ++clock_;
      ++e->leases;
    }
    for (auto& old : retired) hooks_.destroy(old->group, old->comms);
    return Lease(this, std::move(e), rank);
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
  }

 private:
  struct Entry {
    std::vector<int> group;
    std::vector<Comm> comms;
    std::vector<uint64_t> launches;    // per member: calls queued
    std::vector<uint64_t> fence_mark;  // per member: its device's fences() when it last launched
    int leases = 0;
    uint64_t last_use = 0;
  };

  void release(Entry& e, size_t rank, bool launched) {
    std::lock_guard<std::mutex> lock(mu_);
    --e.leases;
    if (launched) {
      ++e.launches[rank];
      e.fence_mark[rank] = hooks_.fences(e.group[rank]);
    }
  }
  bool idle_locked(const Entry& e) const {
    if (e.leases != 0) return false;
    for (size_t m = 0; m < e.group.size(); ++m) {
      if (e.launches[m] != e.launches[0]) return false;
      if (e.launches[m] > 0 && hooks_.fences(e.group[m]) <= e.fence_mark[m]) return false;
    }
    return true;
  }
  // Moves least recently used idle sets (never `keep`) out while over capacity.
  void retire_locked(const Entry* keep, std::vector<std::shared_ptr<Entry>>& out) {
    while (entries_.size() > capacity_) {
      auto victim = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->second.get() == keep || !idle_locked(*it->second)) continue;
        if (victim == entries_.end() || it->second->last_use < victim->second->last_use)
          victim = it;
      }
      if (victim == entries_.end()) return;
      out.push_back(std::move(victim->second));
      entries_.erase(victim);
    }
  }

  const size_t capacity_;
  const Hooks hooks_;
  std::mutex mu_;
  std::map<std::vector<int>, std::shared_ptr<Entry>> entries_;  // guarded by mu_
  uint64_t clock_ = 0;                                          // guarded by mu_
};

}  // namespace meshrt::backend
