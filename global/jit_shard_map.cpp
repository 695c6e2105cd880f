// A shard_map inside a jitted function: the body recorder (global/jit_shard_map.h).
#include "global/jit_shard_map.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/detail/kernel_tape.h"
#include "runtime/detail/op_apply.h"

namespace meshrt::detail {

bool BodyProgram::same_as(const BodyProgram& o, bool attrs) const {
  if (inputs != o.inputs || results != o.results || meta.size() != o.meta.size() ||
      ops.size() != o.ops.size() || constants.size() != o.constants.size()) {
    return false;
  }
  for (size_t v = 0; v < meta.size(); ++v) {
    if (meta[v].shape != o.meta[v].shape || meta[v].dtype != o.meta[v].dtype) return false;
  }
  for (size_t i = 0; i < constants.size(); ++i) {
    if (constants[i].first != o.constants[i].first) return false;
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].op != o.ops[i].op || ops[i].in != o.ops[i].in || ops[i].out != o.ops[i].out)
      return false;
    if (attrs && !(ops[i].attrs == o.ops[i].attrs)) return false;
  }
  return true;
}

BodyRecorder::BodyRecorder(Hooks hooks, Tracer* jit) : hooks_(std::move(hooks)), jit_(jit) {}

BodyRecorder::ViewKey BodyRecorder::view_key(const Tensor& t) {
  return {TensorAccess::buffer(t).get(), TensorAccess::byte_offset(t), t.shape(), t.dtype()};
}

int BodyRecorder::new_value(const Tensor& t) {
  const int v = static_cast<int>(prog_.meta.size());
  prog_.meta.push_back(ResultMeta{t.shape(), t.dtype()});
  held_.push_back(t);
  constant_.push_back(0);
  if (t.valid()) by_view_.emplace(view_key(t), v);
  return v;
}

void BodyRecorder::add_input(Tensor& t, size_t slot) {
  set_trace_id(t, next_trace_id());
  const int v = new_value(t);
  if (hooks_.note) hooks_.note(t);
  by_id_[trace_id(t)] = v;
  if (prog_.inputs.size() <= slot) prog_.inputs.resize(slot + 1, -1);
  prog_.inputs[slot] = v;
}

int BodyRecorder::add_outside(const Tensor& t, size_t slot) {
  if (prog_.inputs.size() <= slot) prog_.inputs.resize(slot + 1, -1);
  if (prog_.inputs[slot] < 0) prog_.inputs[slot] = new_value(t);
  return prog_.inputs[slot];
}

int BodyRecorder::find(const Tensor& t) const {
  if (const uint64_t id = trace_id(t); id != 0) {
    auto it = by_id_.find(id);
    if (it != by_id_.end()) return it->second;
  }
  if (!t.valid()) return -1;
  auto it = by_view_.find(view_key(t));
  return it == by_view_.end() ? -1 : it->second;
}

int BodyRecorder::resolve(const Tensor& t) {
  if (const int v = find(t); v >= 0) return v;
  if (!t.valid()) {
    throw Error("[jit] internal: an empty Tensor reached an op of a shard_map body");
  }
  if (const int slot = hooks_.outside ? hooks_.outside(t) : -1; slot >= 0) {
    return add_outside(t, slot);
  }
  const int v = new_value(t);
  prog_.constants.emplace_back(v, t);
  constant_[static_cast<size_t>(v)] = 1;
  return v;
}

void BodyRecorder::set_results(const std::vector<Tensor>& outs) {
  prog_.results.clear();
  for (const Tensor& t : outs) prog_.results.push_back(t.valid() ? resolve(t) : -1);
}

void BodyRecorder::record(OpId op, std::span<const Tensor* const> inputs, std::span<Tensor> outputs,
                          const OpAttrs& attrs) {
  if (!op_def(op).on_tensor || op == OpId::shard_map) {
    throw Error(cat("[jit] internal: the op '", op_name(op),
                    "' was reported inside a shard_map body and has no Tensor form to replay"));
  }
  BodyOp b;
  b.op = op;
  b.attrs = attrs;
  for (const Tensor* x : inputs) b.in.push_back(resolve(*x));
  for (Tensor& y : outputs) {
    if (trace_id(y) == 0) set_trace_id(y, next_trace_id());
    const int v = static_cast<int>(prog_.meta.size());
    prog_.meta.push_back(ResultMeta{y.shape(), y.dtype()});
    held_.push_back(y);
    constant_.push_back(0);
    // The result may view an operand's memory again (a reshape to the same shape, identity):
    // found by its id first, so each name stays with its own value.
    if (y.valid()) by_view_.emplace(view_key(y), v);
    by_id_[trace_id(y)] = v;
    if (y.valid() && hooks_.note) hooks_.note(y);
    b.out.push_back(v);
  }
  prog_.ops.push_back(std::move(b));
}

void BodyRecorder::record(OpId op, std::span<const Array* const>, std::span<Array>,
                          const OpAttrs&) {
  throw Error(cat("[jit] the global-view op '", op_name(op),
                  "' ran inside a shard_map body under jit; a body computes on its Tensors "
                  "(call global-view ops outside the shard_map)"));
}

bool BodyRecorder::computed(const Tensor& t) const {
  const int v = find(t);
  return v >= 0 && constant_[static_cast<size_t>(v)] == 0;
}

namespace {

bool is_start(std::string_view what) {
  return what == "ppermute_start" || what == "all_gather_start";
}

[[noreturn]] void throw_async(std::string_view what) {
  throw Error(cat("[jit] ", what,
                  " inside a shard_map body under jit is not supported yet: jit replays the "
                  "body's recorded ops and cannot replay an asynchronous collective (nor "
                  "collective_matmul, made of them); use the synchronous ",
                  what.substr(0, what.size() - 6),
                  " (the same results, without the overlap), or call the shard_map outside jit"));
}

}  // namespace

void throw_body_value_read(std::string_view what) {
  throw Error(cat("[jit] ", what,
                  " of a value computed inside a shard_map body under jit: its value is not "
                  "known at trace time (jit records the body once and replays its ops on new "
                  "inputs); return the value from the body and read it after the call, or call "
                  "the shard_map outside jit"));
}

void BodyRecorder::check_tensor_read(const Tensor& t, std::string_view what) {
  if (is_start(what)) throw_async(what);
  if (computed(t) || (t.valid() && hooks_.noted && hooks_.noted(t))) throw_body_value_read(what);
  if (jit_ != nullptr) jit_->check_read(trace_id(t), what);
}

void BodyRecorder::check_array_read(const Array& a, std::string_view what) {
  if (hooks_.array_read) hooks_.array_read(a, what);
}

void BodyRecorder::check_read(uint64_t id, std::string_view what) {
  if (is_start(what)) throw_async(what);
  if (id != 0) {
    auto it = by_id_.find(id);
    if (it != by_id_.end() && constant_[static_cast<size_t>(it->second)] == 0) {
      throw_body_value_read(what);
    }
  }
  if (jit_ != nullptr) jit_->check_read(id, what);
}

size_t compile_body_segments(ShardMapStep& sm, size_t pos, const BodyRecorder& r) {
  sm.segments.clear();
  const BodyProgram& b = sm.bodies[pos];
  const size_t n = b.ops.size();
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> made_by(b.meta.size(), kNone);  // the op making each value
  std::vector<size_t> last_read(b.meta.size(), 0);    // after the last op reading it
  for (size_t i = 0; i < n; ++i) {
    for (int v : b.ops[i].in) last_read[static_cast<size_t>(v)] = i + 1;
    for (int v : b.ops[i].out) made_by[static_cast<size_t>(v)] = i;
  }
  for (int v : b.results) {
    if (v >= 0) last_read[static_cast<size_t>(v)] = kNone;
  }
  auto collective = [&](size_t i) { return op_def(b.ops[i].op).collective; };
  size_t compiled = 0;
  for (size_t i = 0; i < n;) {
    if (collective(i)) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && !collective(j)) ++j;
    BodySegment seg;
    seg.begin = i;
    seg.end = j;
    for (size_t k = i; k < j; ++k) {
      for (int v : b.ops[k].in) {
        const size_t m = made_by[static_cast<size_t>(v)];
        if ((m == kNone || m < i) &&
            std::find(seg.operands.begin(), seg.operands.end(), v) == seg.operands.end()) {
          seg.operands.push_back(v);
        }
      }
      for (int v : b.ops[k].out) {
        if (last_read[static_cast<size_t>(v)] > j) seg.results.push_back(v);
      }
    }
    i = j;
    if (seg.results.empty() || seg.operands.empty()) continue;
    std::vector<Tensor> operands;
    std::vector<char> loose;  // operands, constants and values of earlier bodies
    for (int v : seg.operands) {
      operands.push_back(r.held()[static_cast<size_t>(v)]);
      loose.push_back(made_by[static_cast<size_t>(v)] == kNone ? 1 : 0);
    }
    if (loose_operands_share_memory(operands, loose, seg.operands)) continue;
    auto fn = [&b, &seg](const std::vector<Tensor>& ins) {
      std::vector<Tensor> v(b.meta.size());
      for (size_t k = 0; k < ins.size(); ++k) v[static_cast<size_t>(seg.operands[k])] = ins[k];
      run_body_ops(b, seg.begin, seg.end, v, nullptr);
      std::vector<Tensor> out;
      for (int x : seg.results) out.push_back(v[static_cast<size_t>(x)]);
      return out;
    };
    KernelRecord rec;
    {
      TraceScope off(TraceScope::none);  // the recording's runs are no ops of the function
      rec = record_kernels(fn, operands);
    }
    if (rec.program == nullptr) continue;
    seg.kernels = std::move(rec.program);
    sm.segments.push_back(std::move(seg));
    ++compiled;
  }
  return compiled;
}

void run_body_ops(const BodyProgram& b, size_t begin, size_t end, std::vector<Tensor>& v,
                  Context* ctx) {
  std::vector<Tensor> ins;
  std::vector<ResultMeta> metas;
  for (size_t i = begin; i < end; ++i) {
    const BodyOp& op = b.ops[i];
    ins.clear();
    metas.clear();
    for (int x : op.in) ins.push_back(v[static_cast<size_t>(x)]);
    for (int y : op.out) metas.push_back(b.meta[static_cast<size_t>(y)]);
    std::vector<Tensor> r = apply_op(op.op, ins, op.attrs, metas, ctx);
    if (r.size() != op.out.size()) {
      throw Error(cat("[jit] internal: a shard_map body's op '", op_name(op.op), "' gave ",
                      r.size(), " results, its recording ", op.out.size()));
    }
    for (size_t k = 0; k < r.size(); ++k) v[static_cast<size_t>(op.out[k])] = std::move(r[k]);
    for (int x : op.last) v[static_cast<size_t>(x)] = Tensor();
  }
}

void plan_body_frees(BodyProgram& b) {
  std::vector<int> last(b.meta.size(), -1);  // per value: the last op reading it
  for (size_t i = 0; i < b.ops.size(); ++i) {
    for (int v : b.ops[i].in) last[static_cast<size_t>(v)] = static_cast<int>(i);
  }
  for (int v : b.results) {
    if (v >= 0) last[static_cast<size_t>(v)] = -1;
  }
  for (BodyOp& op : b.ops) op.last.clear();
  for (size_t v = 0; v < last.size(); ++v) {
    if (last[v] >= 0) b.ops[static_cast<size_t>(last[v])].last.push_back(static_cast<int>(v));
  }
}

}  // namespace meshrt::detail
