// collectives/wait.h: how a device waits for its peers without burning a core they need.
//
// A short spin (peers on other cores often arrive within a microsecond), then sched_yield (so a
// peer sharing this core can run), then a futex sleep. With more simulated devices than cores
// the spin phases are cut short, since spinning can only delay the peers being waited for.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace meshrt::core {

// Spins, then yields, while word == value, for about `budget`. True once the word changed.
bool spin_while(const std::atomic<uint32_t>& word, uint32_t value, std::chrono::nanoseconds budget,
                bool oversubscribed);
// Sleeps (futex) while word == value, at most `timeout`. True once the word changed.
bool sleep_while(const std::atomic<uint32_t>& word, uint32_t value,
                 std::chrono::nanoseconds timeout);
// spin_while for the default budget, then sleep_while. False when `timeout` passed first.
bool wait_while(const std::atomic<uint32_t>& word, uint32_t value, std::chrono::nanoseconds timeout,
                bool oversubscribed);
// Wakes every thread sleeping on `word` (call after changing it).
void wake_all(std::atomic<uint32_t>& word);

// How long a waiter spins/yields before it sleeps: long enough to cover a peer's typical
// arrival on a busy machine, short enough not to matter when the peer is computing.
inline constexpr std::chrono::microseconds kSpinBudget{100};

}  // namespace meshrt::core
