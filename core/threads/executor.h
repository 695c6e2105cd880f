// backends/executor.h: a host worker thread that runs one device's tasks in order.
// The cpu backend has one per simulated device; the cuda backend one per (logical) GPU device.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace meshrt::core {

// Runs tasks one at a time, in submission order, on its own thread. The thread starts with the
// first task; an idle worker sleeps on a condition variable, so idle devices cost no CPU.
class Executor {
 public:
  // `on_start` runs first on the new thread (cuda binds the thread to its GPU there).
  explicit Executor(std::function<void()> on_start = {}) : on_start_(std::move(on_start)) {}
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  ~Executor();
  void submit(std::function<void()> task);

 private:
  void loop();
  std::function<void()> on_start_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread thread_;                       // started under mu_
};

// True on a device executor's thread (thread or fiber worker), i.e. inside a device's task.
// The cores this process may count on: the host's, shared evenly with the other processes the
// launcher started on this host (several processes under mpirun on one machine). Executors,
// kernels and BLAS size their threads from it.
int process_cores();
bool on_executor();
// Called once by each executor thread when it starts; also around a caller thread driving a
// fiber worker (FiberPool::drive), whose bodies must see that they run on an executor.
void mark_executor_thread(bool on = true);

}  // namespace meshrt::core
