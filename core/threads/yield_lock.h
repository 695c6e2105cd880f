// collectives/yield_lock.h: a lock for short critical sections shared by more threads than cores.
//
// std::mutex sleeps in the kernel when contended; with 8 simulated devices on 2 cores every
// rendezvous would then pay a futex sleep and wake (~20 us here). This lock spins briefly and
// then yields, so a preempted holder gets the core back at once. Only for sections of a few
// hundred instructions.
#pragma once

#include <sched.h>

#include <atomic>

namespace meshrt::core {

class YieldLock {
 public:
  void lock() {
    for (;;) {
      if (!flag_.exchange(true, std::memory_order_acquire)) return;
      for (int i = 0; flag_.load(std::memory_order_relaxed); ++i) {
        if (i < 16) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        } else {
          sched_yield();
        }
      }
    }
  }
  bool try_lock() { return !flag_.exchange(true, std::memory_order_acquire); }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

}  // namespace meshrt::core
