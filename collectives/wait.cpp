#include "collectives/wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace meshrt::coll {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

uint32_t* futex_word(const std::atomic<uint32_t>& word) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  return reinterpret_cast<uint32_t*>(const_cast<std::atomic<uint32_t>*>(&word));
}

}  // namespace

bool wait_while(const std::atomic<uint32_t>& word, uint32_t value, std::chrono::nanoseconds timeout,
                bool oversubscribed) {
  const int spins = oversubscribed ? 16 : 2000;
  for (int i = 0; i < spins; ++i) {
    if (word.load(std::memory_order_acquire) != value) return true;
    cpu_relax();
  }
  const int yields = oversubscribed ? 8 : 64;
  for (int i = 0; i < yields; ++i) {
    if (word.load(std::memory_order_acquire) != value) return true;
    sched_yield();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (word.load(std::memory_order_acquire) != value) return true;
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) return false;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    syscall(SYS_futex, futex_word(word), FUTEX_WAIT_PRIVATE, value, &ts, nullptr, 0);
  }
}

void wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace meshrt::coll
