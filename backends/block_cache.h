// backends/block_cache.h: a per-device cache of freed memory blocks, shared by the platforms
// (cpu: aligned_alloc'd host memory; cuda: cudaMalloc'd device memory).
//
// Freed blocks are kept per size class and handed out again, so the buffers a loop of
// collectives allocates and drops every step are not returned to the system (re-faulted on cpu,
// cudaFree's device-wide synchronisation on cuda) each time. Classes are 4 per power of two
// (<= 25% slack); at most `limit` bytes are kept. One cache per device keeps the lock
// uncontended: a device allocates on its own thread.
#pragma once

#include <bit>
#include <cstddef>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace meshrt::backend {

class BlockCache {
 public:
  static constexpr size_t kAlignment = 64;
  // `release` returns a block to the system (free, cudaFree). It runs outside the cache's lock,
  // on the thread that gives or trims: it may block (cudaFree waits for the GPU) without
  // stalling the device's allocations, and may call back into the cache.
  BlockCache(size_t limit, std::function<void(void*)> release)
      : limit_(limit), release_(std::move(release)) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache() { trim(); }

  static size_t size_class(size_t bytes) {
    if (bytes <= 4096) return (bytes + kAlignment - 1) / kAlignment * kAlignment;
    const size_t top = std::bit_floor(bytes), step = top / 4;
    return (bytes + step - 1) / step * step;
  }
  // A cached block of class `cls`, or null.
  void* take(size_t cls) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cls);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= cls;
    return p;
  }
  // Keeps `p` unless it alone exceeds a quarter of the limit (then the caller releases it);
  // makes room by releasing the largest cached blocks (stale big buffers must not lock out the
  // sizes in use now).
  bool give(void* p, size_t cls) {
    if (cls > limit_ / 4) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + cls <= limit_) {  // the common case: room without releasing anything
        free_[cls].push_back(p);
        cached_ += cls;
        return true;
      }
    }
    give_evicting(p, cls);
    return true;
  }
  // Releases every cached block (e.g. before retrying an allocation that ran out of memory).
  size_t trim() {
    std::map<size_t, std::vector<void*>> all;
    size_t released = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all.swap(free_);
      released = cached_;
      cached_ = 0;
    }
    for (auto& [cls, blocks] : all) {
      for (void* p : blocks) release_(p);
    }
    return released;
  }
  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

 private:
  void give_evicting(void* p, size_t cls) {
    std::vector<void*> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (cached_ + cls > limit_ && !free_.empty()) {
        auto big = std::prev(free_.end());
        if (big->second.empty()) {
          free_.erase(big);
          continue;
        }
        victims.push_back(big->second.back());
        big->second.pop_back();
        cached_ -= big->first;
      }
      free_[cls].push_back(p);
      cached_ += cls;
    }
    for (void* v : victims) release_(v);
  }

  const size_t limit_;
  const std::function<void(void*)> release_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // guarded by mu_
  size_t cached_ = 0;                          // guarded by mu_
};

}  // namespace meshrt::backend
