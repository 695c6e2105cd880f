#include "core/threads/wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <ctime>

#include "core/threads/fiber_executor.h"

namespace meshrt::core {

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

bool spin_while(const std::atomic<uint32_t>& word, uint32_t value, std::chrono::nanoseconds budget,
                bool oversubscribed) {
  if (word.load(std::memory_order_acquire) != value) return true;
  if (on_fiber()) {  // waiting is handing the thread to the other devices
    const auto until = std::chrono::steady_clock::now() + budget;
    while (cooperative_wait(word, value, until)) {
      if (word.load(std::memory_order_acquire) != value) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
    }
  }
  // With more runnable devices than cores a pure spin only delays the peer being waited for:
  // spin a little, then yield so that peer can run on this core.
  const int spins = oversubscribed ? 0 : 4000;
  for (int i = 0; i < spins; ++i) {
    if (word.load(std::memory_order_acquire) != value) return true;
    cpu_relax();
  }
  // The clock is read only every 16 yields: most waits end before the first read.
  std::chrono::steady_clock::time_point deadline{};
  for (int i = 0;; ++i) {
    if (word.load(std::memory_order_acquire) != value) return true;
    if ((i & 15) == 15) {
      const auto now = std::chrono::steady_clock::now();
      if (i == 15)
        deadline = now + budget;
      else if (now >= deadline)
        return false;
    }
    sched_yield();
  }
}

bool sleep_while(const std::atomic<uint32_t>& word, uint32_t value,
                 std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // A fiber must not block its thread: the devices sharing it may be the ones awaited.
  while (cooperative_wait(word, value, deadline)) {
    if (word.load(std::memory_order_seq_cst) != value) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
  for (;;) {
    // seq_cst: pairs with the sleeper count a waker reads after its store (Dekker-style).
    if (word.load(std::memory_order_seq_cst) != value) return true;
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) return false;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    syscall(SYS_futex, futex_word(word), FUTEX_WAIT_PRIVATE, value, &ts, nullptr, 0);
  }
}

bool wait_while(const std::atomic<uint32_t>& word, uint32_t value, std::chrono::nanoseconds timeout,
                bool oversubscribed) {
  if (spin_while(word, value, std::min<std::chrono::nanoseconds>(kSpinBudget, timeout),
                 oversubscribed))
    return true;
  return sleep_while(word, value, timeout);
}

void wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace meshrt::core
