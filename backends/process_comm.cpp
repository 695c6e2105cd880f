#include "backends/process_comm.h"

#include <atomic>

#include "core/error.h"

namespace meshrt::backend {
namespace {
std::atomic<ProcessComm*> g_process_comm{nullptr};
}

ProcessComm* process_comm() { return g_process_comm.load(std::memory_order_acquire); }

void set_process_comm(std::unique_ptr<ProcessComm> comm) {
  ProcessComm* expected = nullptr;
  // Leaked on purpose: the exit step and executors may use it while static destructors run.
  ProcessComm* c = comm.release();
  if (!g_process_comm.compare_exchange_strong(expected, c)) {
    delete c;
    throw Error("[distributed] the process communication library is already installed");
  }
}

}  // namespace meshrt::backend
