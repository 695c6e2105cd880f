// backends/fiber_executor.h: many devices on few threads, as user-level fibers.
//
// With more simulated devices than cores, a thread per device pays a kernel context switch
// (several microseconds here) every time a device waits for a peer. A FiberPool instead runs
// each device as a fiber on one of `workers` (device d on worker d % workers), run by that
// worker's thread or, while it waits for a launch, by the launching thread (drive);
// a device that waits in a collective hands its thread to the next runnable device of that
// worker in ~100 ns, and the worker checks waiting devices' conditions without switching into
// them. Tasks of one device still run one at a time, in submission order.
//
// Caveat (documented for users): a body that blocks its thread on something other than a
// meshrt collective (a std::mutex or barrier shared with another device's body, sleep, I/O)
// also stalls the devices sharing its worker; MESHRT_CPU_EXECUTOR=threads avoids that.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace meshrt::core {

class FiberPool {
 public:
  FiberPool(int devices, int workers);
  FiberPool(const FiberPool&) = delete;
  FiberPool& operator=(const FiberPool&) = delete;
  ~FiberPool();
  void submit(int device, std::function<void()> task);
  // Called by a thread waiting for tasks it submitted (a launch): runs the fibers of `device`'s
  // worker on this thread until done != 0, instead of waking that worker's thread and then
  // being woken itself (two futex round trips that cost more than a short body). False at once
  // when the worker's own thread is running it (then wait as usual) or the caller is a worker.
  // A task still runs start to end on one thread: the caller returns only once `done`, set when
  // every task it waits for has ended; only idle fibers move between the caller and the
  // worker's thread.
  bool drive(int device, const std::atomic<uint32_t>& done);
  // drive() in two steps: claim the worker of `device` before submitting (so the submissions
  // do not wake its thread), then drive it. False when it cannot be claimed; a successful claim
  // must be followed by drive() on the same thread.
  bool claim(int device);

  struct Fiber;
  struct Worker;

 private:
  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::vector<std::unique_ptr<Worker>> workers_;
  void* stacks_ = nullptr;  // every fiber's guard page and stack, one mapping
  size_t stacks_bytes_ = 0;
};

// On a device executor that multiplexes devices on its thread (a fiber), lets the other devices
// run until word != value or `deadline` passes, then returns true; the caller re-checks its
// condition. Elsewhere returns false at once and the caller must wait by itself (spin/futex).
bool cooperative_wait(const std::atomic<uint32_t>& word, uint32_t value,
                      std::chrono::steady_clock::time_point deadline);
// How long a fiber should wait cooperatively (handing its thread to the other devices) before
// it falls back to a waiter's slower path (registering for deadlock checks, timed slices):
// `budget`, raised to kCooperativeWaitPerFiber for each device with work on the caller's worker,
// since a peer on this worker can only arrive once the worker has run every device ahead of it
// (10 us each: 20 ms for 2048). `budget` itself off a fiber.
std::chrono::nanoseconds cooperative_wait_budget(std::chrono::nanoseconds budget);
inline constexpr std::chrono::microseconds kCooperativeWaitPerFiber{10};
// True once any fiber executor exists in the process (for error messages).
bool fiber_executors_in_use();
// True when the caller runs on a fiber (so cooperative_wait applies).
bool on_fiber();

// A pointer private to the task running on this thread: a device body on a fiber keeps its own
// value across cooperative waits (the fiber switch saves and restores it; a fiber starts a task
// with nullptr); elsewhere it is a plain thread-local. Autodiff keeps a body's tape here.
void*& task_local_slot();

}  // namespace meshrt::core
