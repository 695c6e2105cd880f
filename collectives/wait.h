// collectives/wait.h: how a device waits for its peers without burning a core they need.
//
// A short spin (peers on other cores often arrive within a microsecond), then sched_yield (so a
// peer sharing this core can run), then a futex sleep. With more simulated devices than cores
// the spin phases are cut short, since spinning can only delay the peers being waited for.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace meshrt::coll {

// Waits while word == value. Returns false when `timeout` passed first.
bool wait_while(const std::atomic<uint32_t>& word, uint32_t value, std::chrono::nanoseconds timeout,
                bool oversubscribed);
// Wakes every thread waiting on `word` (call after changing it).
void wake_all(std::atomic<uint32_t>& word);

}  // namespace meshrt::coll
