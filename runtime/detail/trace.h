// runtime/detail/trace.h: the one hook the op dispatch has for autodiff (not installed).
//
// While a tracer is active on the calling task (autodiff's tape during value_and_grad, a body's
// tape inside a differentiated shard_map), every differentiable op reports what it ran:
//
//   Tensor exp(const Tensor& x) {
//     detail::Traced<Tensor> tr(OpId::exp, {&x});
//     return tr(unary_op(UnaryOp::exp, x));   // recorded when a tracer follows x
//   }
//
// Ops made of other ops are recorded once, as themselves: the inner ops of a traced op are not
// reported (a Traced suppresses tracing until it records). With no tracer active a Traced costs
// one task-local load. runtime/ only reports; the rules, the tape and the backward pass live in
// autodiff/, which installs tracers.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "runtime/detail/access.h"
#include "runtime/detail/op_registry.h"

namespace meshrt {
class Tensor;
class Array;
class Mesh;
class PartitionSpec;
struct ShardMapOptions;
class Context;
}  // namespace meshrt

namespace meshrt::detail {

using ErasedBody = std::function<std::vector<Tensor>(Context&, const std::vector<Tensor>&)>;
using RunShardMap = std::vector<Array> (*)(const ErasedBody&, const Mesh&,
                                           const std::vector<PartitionSpec>&,
                                           const std::vector<PartitionSpec>&,
                                           const std::vector<Array>&, const ShardMapOptions&);

// What autodiff implements. Ops call it through Traced (below); shard_map offers itself whole.
class Tracer {
 public:
  virtual ~Tracer() = default;
  // `op` ran on `inputs` giving `outputs`: the tracer records it when it follows an input, and
  // then gives each output a trace id (next_trace_id) unless an earlier tracer in the stack gave
  // it one for this op (outputs arrive with id 0).
  virtual void record(OpId op, std::span<const Tensor* const> inputs, std::span<Tensor> outputs,
                      const OpAttrs& attrs) = 0;
  virtual void record(OpId op, std::span<const Array* const> inputs, std::span<Array> outputs,
                      const OpAttrs& attrs) = 0;
  // A host read (`what`: "to_vector", ...) of a value with this trace id: throws when the tracer
  // differentiates it (a gradient cannot flow through host memory).
  virtual void check_read(uint64_t trace_id, std::string_view what) = 0;
  // A host read of Tensor `t` (to_vector, device_put of a Tensor, an asynchronous collective's
  // start): check_read of its trace id where it has one. A tracer that also knows its values by
  // the memory they view (jit's shard_map bodies: copies of a handle made elsewhere, with ids of
  // their own or none, after stop_gradient) overrides it.
  virtual void check_tensor_read(const Tensor& t, std::string_view what);
  // The same for an Array (to_vector, addressable_shards): check_read of its trace id where it
  // has one; jit's tracer also knows its blocks (an Array after stop_gradient has no id).
  virtual void check_array_read(const Array& a, std::string_view what);
  // A shard_map call: the tracer runs it (through `run`, with the body wrapped to trace the
  // bodies) when it follows an argument, else returns std::nullopt and shard_map runs as usual.
  virtual std::optional<std::vector<Array>> shard_map(RunShardMap run, const ErasedBody& body,
                                                      const Mesh& mesh,
                                                      const std::vector<PartitionSpec>& in_specs,
                                                      const std::vector<PartitionSpec>& out_specs,
                                                      const std::vector<Array>& args,
                                                      const ShardMapOptions& options) = 0;
};

// The tracers active on this task, innermost last, and how many traced ops are running.
struct TraceState {
  std::vector<Tracer*> tracers;
  int suppressed = 0;
  // A jit trace is recording: tracers[0] is jit's, and every shard_map goes through it (inner
  // tracers, autodiff's tape, get a `run` that does; see run_shard_map).
  bool jit = false;
};
// This task's state (a device body on a fiber has its own), or nullptr when none was installed.
// TraceScope is the one way to change it.
TraceState* trace_state();
// A fresh, process-wide unique id for a traced value (never 0).
uint64_t next_trace_id();

// True when an op starting now on this task would be reported.
inline bool tracing() {
  const TraceState* s = trace_state();
  return s != nullptr && s->suppressed == 0 && !s->tracers.empty();
}

// A host read of a traced value: lets the tracers refuse it (see Tracer::check_read).
void check_host_read(uint64_t trace_id, std::string_view what);
// The same for a Tensor or an Array, whatever its trace id (Tracer::check_tensor_read,
// check_array_read).
void check_host_read(const Tensor& t, std::string_view what);
void check_host_read(const Array& a, std::string_view what);

// Starts and ends tracing on this task: what traces the task while the scope lives, and what
// traced it before once it ends (exceptions included). The one way tracing state changes:
//
//   TraceScope on(tape);                          // autodiff: tape becomes the innermost tracer
//   TraceScope on(TraceScope::jit, recorder);     // a jit trace: its tracer first, and every
//                                                 // shard_map through it
//   TraceScope off(TraceScope::none);             // nothing traces (a kernel recording)
//
// Scopes nest and end in reverse order (they live on the stack, or in an object that does).
class TraceScope {
 public:
  struct Jit {};
  struct None {};
  static constexpr Jit jit{};
  static constexpr None none{};

  // `tracer` becomes the innermost tracer of this task; outer ones keep tracing (grad of grad).
  explicit TraceScope(Tracer& tracer);
  // A jit trace: `tracer` is the task's only tracer (tapes started inside push after it), and
  // every shard_map inside is recorded by it.
  TraceScope(Jit, Tracer& tracer);
  // No tracer sees this task's ops.
  explicit TraceScope(None);
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  ~TraceScope();

 private:
  TraceState own_;                   // the state installed when the scope needs its own
  TraceState* previous_;             // the task's state before the scope
  TraceState* pushed_to_ = nullptr;  // the state the tracer was pushed onto, if any
  bool installed_ = false;           // the scope installed a state (restore previous_ at the end)
};

// Holds tracing off on this task while it lives: ops run inside (a transform's own steps, the
// global view's launches, a traced op's inner ops) are not the user's ops, and tracers do not see
// them. release() ends it early.
class Untraced {
 public:
  Untraced() : state_(trace_state()) {
    if (state_ != nullptr) ++state_->suppressed;
  }
  Untraced(const Untraced&) = delete;
  Untraced& operator=(const Untraced&) = delete;
  ~Untraced() { release(); }
  // Lets tracers see this task's ops again, before the guard ends.
  void release() {
    if (state_ != nullptr) --state_->suppressed;
    state_ = nullptr;
  }

 private:
  TraceState* state_;
};

// Reports one op: construct at the op's start, pass the result(s) through operator() / outputs().
// Until then the op's inner ops are not reported (an Untraced).
template <class T>
class Traced {
 public:
  Traced(OpId op, std::initializer_list<const T*> inputs) {
    if (!tracing()) return;
    start(op);
    inputs_.assign(inputs.begin(), inputs.end());
  }
  Traced(OpId op, const std::vector<T>& inputs) {
    if (!tracing()) return;
    start(op);
    for (const T& x : inputs) inputs_.push_back(&x);
  }
  Traced(const Traced&) = delete;
  Traced& operator=(const Traced&) = delete;
  // True when the op will be reported: set its attributes (the kind its OpDef names) then.
  explicit operator bool() const { return inner_.has_value(); }
  template <class A>
  void set_attrs(A attrs) {
    attrs_ = std::move(attrs);
  }

  T operator()(T out) {
    if (inner_) report(std::span<T>(&out, 1));
    return out;
  }
  std::vector<T> outputs(std::vector<T> outs) {
    if (inner_) report(std::span<T>(outs));
    return outs;
  }

 private:
  void start(OpId op) {
    inner_.emplace();
    op_ = op;
  }
  void report(std::span<T> outs) {
    inner_.reset();
    MESHRT_DCHECK(attrs_.index() == op_def(op_).attrs);
    for (T& y : outs) detail::set_trace_id(y, 0);  // an op may return an operand; its result is new
    for (Tracer* t : std::vector<Tracer*>(trace_state()->tracers))
      t->record(op_, inputs_, outs, attrs_);
  }

  std::optional<Untraced> inner_;  // the op's own ops, held off until it reports
  OpId op_ = OpId::identity;
  std::vector<const T*> inputs_;
  OpAttrs attrs_;
};

}  // namespace meshrt::detail
