// global/jit_shard_map.h: a shard_map inside a jitted function, recorded (not installed).
//
// jit cannot keep the body to call it again: a body may capture references to the jitted
// function's locals, gone once the trace returns, and jit promises to run the function once. So
// each device's body is traced while the shard_map runs at trace time: a BodyRecorder, installed
// as the body task's tracer, writes down every op the body reports (Tensor ops and collectives,
// runtime/detail/trace.h) as ops on values (BodyProgram, global/jit_ir.h). The replay runs those
// ops again through the same Tensor ops and collectives (apply_op), so it gives the eager
// shard_map's bits.
//
// A Tensor an op reads that no op of the body made is resolved, in order: by the trace id the
// recorder gave it; by the memory it views (the recorder holds every value it knows, so no other
// Tensor can come to view that memory while it records; autodiff's tape views the body's
// operands again under ids of its own); as a block an earlier shard_map step of the same trace
// made or read (Hooks::outside: what the transpose body of value_and_grad reads of the forward
// body); else it is a constant of the program (made by what tracers do not see: zeros, full, random
// numbers from a key, a Tensor the body captured).
//
// The body gets copies of its blocks (memory nothing else views), so two arguments sharing a
// block, or a block the body also captures, stay separate values.
//
// What a straight list of ops cannot repeat is refused with an Error: an asynchronous
// collective (ppermute_start, all_gather_start; the synchronous ones record), a host read of a
// value any body of the trace computed or was given (Hooks::noted: by its memory, whoever reads
// it), global-view ops inside a body.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <span>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "global/jit_ir.h"
#include "runtime/detail/trace.h"

namespace meshrt::detail {

class BodyRecorder final : public Tracer {
 public:
  // What the recorder asks of jit's recorder, from the body's task (each takes the recorder's
  // lock: every body of the shard_map records at once).
  struct Hooks {
    // A block of an earlier shard_map step that `t` views: the operand slot of this step it comes
    // in through (the step adds it), or -1 when it is none.
    std::function<int(const Tensor& t)> outside;
    // `t` is a value the body computed or was given: its memory is noted for the whole trace.
    std::function<void(const Tensor& t)> note;
    // Whether the memory `t` views is a value some body of the trace computed or was given (this
    // body's siblings on other devices included).
    std::function<bool(const Tensor& t)> noted;
    // jit's check of a host read of an Array (one the jitted function computed).
    std::function<void(const Array& a, std::string_view what)> array_read;
  };
  // `jit`: the jitted function's tracer, asked about host reads of the values it follows.
  BodyRecorder(Hooks hooks, Tracer* jit);

  // The body's operand `slot` is `t`: gives it a fresh trace id.
  void add_input(Tensor& t, size_t slot);
  // Operand `slot` of the step that an `Outside` block comes in through, at this position.
  int add_outside(const Tensor& t, size_t slot);
  // The body's results (the step's first results).
  void set_results(const std::vector<Tensor>& outs);
  // The value `t` is, when the body made or read it (by trace id or by the memory it views);
  // else -1.
  int find(const Tensor& t) const;
  // The recording ended: no more lookups (their state is gone) or host-read checks.
  void finish() {
    hooks_ = {};
    jit_ = nullptr;
  }
  const BodyProgram& program() const { return prog_; }
  BodyProgram& program() { return prog_; }
  // The Tensor each value had at trace time (the blocks an `Outside` lookup finds).
  const std::vector<Tensor>& held() const { return held_; }

  void record(OpId op, std::span<const Tensor* const> inputs, std::span<Tensor> outputs,
              const OpAttrs& attrs) override;
  void record(OpId op, std::span<const Array* const>, std::span<Array>, const OpAttrs&) override;
  void check_read(uint64_t trace_id, std::string_view what) override;
  void check_tensor_read(const Tensor& t, std::string_view what) override;
  void check_array_read(const Array& a, std::string_view what) override;
  // Whether `t` is a value the body computed or was given (not a constant): its value is not
  // known at trace time.
  bool computed(const Tensor& t) const;
  std::optional<std::vector<Array>> shard_map(RunShardMap, const ErasedBody&, const Mesh&,
                                              const std::vector<PartitionSpec>&,
                                              const std::vector<PartitionSpec>&,
                                              const std::vector<Array>&,
                                              const ShardMapOptions&) override {
    return std::nullopt;  // check_call refuses a shard_map inside a body
  }

 private:
  using ViewKey = std::tuple<const void*, size_t, Shape, DType>;
  static ViewKey view_key(const Tensor& t);
  int new_value(const Tensor& t);
  // The value `t` is, found (find, then Outside) or made a constant.
  int resolve(const Tensor& t);

  Hooks hooks_;
  Tracer* jit_;
  BodyProgram prog_;
  std::vector<Tensor> held_;    // per value: its Tensor at trace time
  std::vector<char> constant_;  // per value: a constant of the program
  std::unordered_map<uint64_t, int> by_id_;
  std::map<ViewKey, int> by_view_;
};

// Compiles the runs of ops without collectives of `sm`'s bodies with the kernel tape
// (record_kernels), recorded on one position's values at trace time (`r`, the recorder of
// position `pos`), into ShardMapStep::segments; a run the tape refuses keeps its ops. Only where
// every position's program is the same (BodyProgram::same_as), and only once every result of the
// step is known (those exported to later steps too). Returns the number of runs compiled.
size_t compile_body_segments(ShardMapStep& sm, size_t pos, const BodyRecorder& r);

// Runs ops [begin, end) of `b` on the values `v` (indexed by value; the ops' results are written
// there, and what they read for the last time let go): through apply_op, `ctx` the body's context
// (null outside a body: then a collective is an internal Error).
void run_body_ops(const BodyProgram& b, size_t begin, size_t end, std::vector<Tensor>& v,
                  Context* ctx);

// The Error for a host read (`what`: to_vector, device_put) of a value a shard_map body computed
// or was given, under jit.
[[noreturn]] void throw_body_value_read(std::string_view what);

// Sets each op's BodyOp::last: the values it reads that no later op reads and that are not
// results (the replay lets them go there, as the eager body's Tensors go out of scope). Called
// by the plan, once every result (those exported to later steps too) is known.
void plan_body_frees(BodyProgram& b);

}  // namespace meshrt::detail
