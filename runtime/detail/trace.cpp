// The autodiff hook's task-local state (see trace.h).
#include "runtime/detail/trace.h"

#include <atomic>

#include "core/error.h"
#include "core/threads/fiber_executor.h"
#include "runtime/array.h"
#include "runtime/tensor.h"

namespace meshrt::detail {

TraceState* trace_state() { return static_cast<TraceState*>(core::task_local_slot()); }

namespace {
// Installs `state` for this task and returns the previous one (TraceScope restores it).
TraceState* set_trace_state(TraceState* state) {
  void*& slot = core::task_local_slot();
  TraceState* previous = static_cast<TraceState*>(slot);
  slot = state;
  return previous;
}
}  // namespace

TraceScope::TraceScope(Tracer& tracer) : previous_(trace_state()) {
  if (previous_ != nullptr) {
    pushed_to_ = previous_;
  } else {
    pushed_to_ = &own_;
    installed_ = true;
    set_trace_state(&own_);
  }
  pushed_to_->tracers.push_back(&tracer);
}

TraceScope::TraceScope(Jit, Tracer& tracer) : previous_(set_trace_state(&own_)), installed_(true) {
  own_.tracers.push_back(&tracer);
  own_.jit = true;
}

TraceScope::TraceScope(None) : previous_(set_trace_state(nullptr)), installed_(true) {}

TraceScope::~TraceScope() {
  if (pushed_to_ != nullptr) {
    MESHRT_DCHECK(!pushed_to_->tracers.empty());
    pushed_to_->tracers.pop_back();
  }
  if (installed_) set_trace_state(previous_);
}

uint64_t next_trace_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void Tracer::check_tensor_read(const Tensor& t, std::string_view what) {
  if (trace_id(t) != 0) check_read(trace_id(t), what);
}

void Tracer::check_array_read(const Array& a, std::string_view what) {
  if (trace_id(a) != 0) check_read(trace_id(a), what);
}

void check_host_read(const Array& a, std::string_view what) {
  if (!tracing()) return;
  for (Tracer* tr : trace_state()->tracers) tr->check_array_read(a, what);
}

void check_host_read(const Tensor& t, std::string_view what) {
  if (!tracing()) return;
  for (Tracer* tr : trace_state()->tracers) tr->check_tensor_read(t, what);
}

void check_host_read(uint64_t trace_id, std::string_view what) {
  if (trace_id == 0 || !tracing()) return;
  for (Tracer* t : trace_state()->tracers) t->check_read(trace_id, what);
}

}  // namespace meshrt::detail
