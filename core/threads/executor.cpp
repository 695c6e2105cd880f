#include "core/threads/executor.h"

#include <algorithm>
#include <utility>

#include "core/config.h"

namespace meshrt::core {

namespace {
thread_local bool t_on_executor = false;
}  // namespace

int process_cores() {
  static const int cores =
      std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) /
                      config::launcher_local_processes());
  return cores;
}

bool on_executor() { return t_on_executor; }
void mark_executor_thread(bool on) { t_on_executor = on; }

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Executor::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
}

void Executor::loop() {
  mark_executor_thread();
  if (on_start_) on_start_();
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace meshrt::core
