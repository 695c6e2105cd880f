// jit's recorder: the trace (a tracer that follows the function's values and lists its ops) and the
// launch observer (global/launch.h) that appends a step per launch of the global view.
#include <algorithm>
#include <charconv>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "collectives/direct.h"
#include "collectives/groups.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "global/collective_log.h"
#include "global/jit_ir.h"
#include "global/jit_program.h"
#include "global/jit_shard_map.h"
#include "global/launch.h"
#include "global/layout.h"
#include "runtime/detail/access.h"
#include "runtime/detail/kernel_tape.h"
#include "runtime/detail/launch.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/trace.h"
#include "runtime/tensor_ops.h"

namespace meshrt::detail {

namespace {

// A constant's block is known by the memory it views (views of one block differ in offset,
// shape or dtype): the program holds every constant's blocks (JitValue::blocks), so no other
// block can come to view that memory while the trace records.
using ConstantKey = std::tuple<const void*, size_t, Shape, DType>;
ConstantKey constant_key(const Tensor& t) {
  return {TensorAccess::buffer(t).get(), TensorAccess::byte_offset(t), t.shape(), t.dtype()};
}

// True when `a` is `b` viewed again (a new Tensor onto the same bytes, shape and dtype).
bool same_view(const Tensor& a, const Tensor& b) {
  return a.valid() && TensorAccess::buffer(a) == TensorAccess::buffer(b) &&
         TensorAccess::byte_offset(a) == TensorAccess::byte_offset(b) && a.shape() == b.shape() &&
         a.dtype() == b.dtype();
}

// "float32[4,8]".
std::string type_str(DType dtype, const Shape& shape) {
  std::string s = cat(dtype_name(dtype), "[");
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? "," : "", shape[i]);
  return s + "]";
}

std::string aval(const Array& a) {
  const std::string s = type_str(a.dtype(), a.shape());
  if (!a.sharding().as_named()) return s + " " + a.sharding().str();
  return s + " " + global::layout_str(global::layout_of(a));
}

// The step that moves `in` onto `to` (device_put's own and the global view's reshards).
JitStep reshard_step(const Array& in, const Sharding& to) {
  JitStep s;
  s.op = ReshardStep{in.shape(), in.dtype(), in.sharding(), to, in.pending_sum_axes()};
  return s;
}

}  // namespace

// The tracer half of a trace: follows every value the program computes (so reading one on the
// host is refused), and lists the ops for the program's text.
class JitTracer final : public Tracer {
 public:
  explicit JitTracer(JitRecorder* rec) : rec_(rec) {}
  // A Tensor op of the function itself (outside any shard_map body): refused on a value a body
  // computed, which only the body's recording can replay.
  void record(OpId op, std::span<const Tensor* const> inputs, std::span<Tensor>,
              const OpAttrs&) override;
  void record(OpId op, std::span<const Array* const> inputs, std::span<Array> outputs,
              const OpAttrs& attrs) override;
  // A Tensor a shard_map body of this trace computed or was given (stashed by the body, read by
  // the function after the call) is no more known at trace time than an Array the function
  // computed.
  void check_tensor_read(const Tensor& t, std::string_view what) override;
  // An Array whose blocks an input or a step of the trace made (after stop_gradient too, which
  // drops the Array's id but not its blocks').
  void check_array_read(const Array& a, std::string_view what) override;
  void check_read(uint64_t trace_id, std::string_view what) override {
    if (followed_.count(trace_id) != 0) throw_not_known(what);
  }
  [[noreturn]] static void throw_not_known(std::string_view what) {
    throw Error(cat("[jit] ", what,
                    " of a value computed inside a jitted function: its value is not known at "
                    "trace time (jit records the function once and replays it on new inputs); "
                    "return the value from the function and read it after the call, or compute "
                    "it outside jit"));
  }
  // Every shard_map of the trace comes here (runtime/shard_map.cpp): recorded as a step.
  std::optional<std::vector<Array>> shard_map(RunShardMap, const ErasedBody& body, const Mesh& mesh,
                                              const std::vector<PartitionSpec>& in_specs,
                                              const std::vector<PartitionSpec>& out_specs,
                                              const std::vector<Array>& args,
                                              const ShardMapOptions& options) override;
  void follow(Array& a) {
    if (detail::trace_id(a) == 0) detail::set_trace_id(a, next_trace_id());
    followed_.insert(detail::trace_id(a));
  }

 private:
  JitRecorder* rec_;
  std::unordered_set<uint64_t> followed_;
};

// The recorder half: the launch observer that appends a step per launch (global/launch.h).
class JitRecorder final : public global::LaunchObserver {
 public:
  explicit JitRecorder(std::string name) : prog(std::make_shared<JitProgram>()), tracer(this) {
    prog->name = std::move(name);
  }

  int new_value(int npos) {
    JitValue v;
    v.npos = npos;
    prog->values.push_back(std::move(v));
    return static_cast<int>(prog->values.size()) - 1;
  }
  void grow_block_bytes(int vid, const Array& a) {
    size_t& b = prog->values[static_cast<size_t>(vid)].block_bytes;
    for (const Tensor& t : ArrayAccess::blocks(a)) b = std::max(b, t.nbytes());
  }
  // The value and position that block `t` is, or null: an input's or a step's block by its name
  // (its trace id), a constant's by the memory it views.
  const Ref* find(const Tensor& t) const {
    if (detail::trace_id(t) != 0) {
      auto it = named.find(detail::trace_id(t));
      if (it != named.end()) return &it->second;
    }
    if (!t.valid()) return nullptr;
    auto it = constants.find(constant_key(t));
    return it == constants.end() ? nullptr : &it->second;
  }
  // Names block `pos` of `a` as `ref`: a block without a trace id gets a fresh one first (copies
  // of `a` made from now on share it).
  void name(Array& a, size_t pos, Ref ref) {
    if (detail::trace_id(ArrayAccess::blocks(a)[pos]) == 0)
      ArrayAccess::set_block_trace_id(a, pos, next_trace_id());
    const uint64_t id = detail::trace_id(ArrayAccess::blocks(a)[pos]);
    if (id != 0) named.emplace(id, ref);
  }
  // The blocks of `a` as refs; blocks nothing made are a constant of the program.
  std::vector<Ref> refs_of(const Array& a) {
    std::vector<Ref> refs;
    int constant = -1;
    for (size_t p = 0; p < ArrayAccess::blocks(a).size(); ++p) {
      const Tensor& t = ArrayAccess::blocks(a)[p];
      if (const Ref* r = find(t)) {
        refs.push_back(*r);
        continue;
      }
      if (constant < 0) {
        constant = new_value(static_cast<int>(ArrayAccess::blocks(a).size()));
        prog->values[static_cast<size_t>(constant)].constant = true;
        prog->values[static_cast<size_t>(constant)].blocks = ArrayAccess::blocks(a);
        grow_block_bytes(constant, a);
      }
      const Ref r{constant, static_cast<int>(p)};
      if (t.valid()) constants.emplace(constant_key(t), r);
      refs.push_back(r);
    }
    return refs;
  }
  // True when every block of `a` is an input's or a step's (not a constant's).
  bool computed(const Array& a) const {
    for (const Tensor& t : ArrayAccess::blocks(a)) {
      const Ref* r = find(t);
      if (r == nullptr || prog->values[static_cast<size_t>(r->vid)].constant) return false;
    }
    return !ArrayAccess::blocks(a).empty();
  }
  bool any_known(const Array& a) const {
    for (const Tensor& t : ArrayAccess::blocks(a)) {
      const Ref* r = find(t);
      if (r != nullptr && !prog->values[static_cast<size_t>(r->vid)].constant) return true;
    }
    return false;
  }
  // Names the blocks of `out` that are not known yet as value `vid`'s. A block the launch gave
  // back from an operand keeps the operand's name; one that views an operand's block again
  // (`ins`, read as `in_refs`; a reshape to the same block shape) is that operand's block too:
  // the replay reads the operand and needs no step to make it.
  void name_blocks(Array& out, int vid, const std::vector<Array>& ins = {},
                   const std::vector<std::vector<Ref>>& in_refs = {}) {
    grow_block_bytes(vid, out);
    for (size_t p = 0; p < ArrayAccess::blocks(out).size(); ++p) {
      const Tensor& t = ArrayAccess::blocks(out)[p];
      if (find(t) != nullptr) continue;
      Ref r{vid, static_cast<int>(p)};
      for (size_t j = 0; j < ins.size(); ++j) {
        if (p < ArrayAccess::blocks(ins[j]).size() &&
            same_view(t, ArrayAccess::blocks(ins[j])[p])) {
          r = in_refs[j][p];
          break;
        }
      }
      name(out, p, r);
    }
  }
  void add_step(JitStep s, const std::vector<Array>& ins, std::span<Array> outs) {
    for (const Array& a : ins) s.in.push_back(refs_of(a));
    for (Array& a : outs) {
      const int vid = new_value(static_cast<int>(ArrayAccess::blocks(a).size()));
      s.out.push_back(vid);
      name_blocks(a, vid, ins, s.in);
    }
    prog->steps.push_back(std::move(s));
  }
  // The line whose result `a` is, or kConst.
  int line_of(const Array& a) const {
    if (ArrayAccess::blocks(a).empty() || detail::trace_id(ArrayAccess::blocks(a).front()) == 0)
      return kConst;
    auto it = line_by_block.find(detail::trace_id(ArrayAccess::blocks(a).front()));
    return it == line_by_block.end() ? kConst : it->second;
  }
  // `line_of` for an operand or output read as the program text shows it: the line that made
  // it, the input it is (-1 - input), or kConst.
  int from_of(const Array& a) const {
    const int from = line_of(a);
    if (from != kConst || ArrayAccess::blocks(a).empty()) return from;
    const Ref* r = find(ArrayAccess::blocks(a).front());
    if (r == nullptr) return kConst;
    const int input = prog->values[static_cast<size_t>(r->vid)].input;
    return input >= 0 ? -1 - input : kConst;
  }
  // `a` is a result of line `index` (its blocks get names first, when they have none).
  void set_line(Array& a, int index) {
    for (size_t p = 0; p < ArrayAccess::blocks(a).size(); ++p) {
      if (detail::trace_id(ArrayAccess::blocks(a)[p]) == 0)
        ArrayAccess::set_block_trace_id(a, p, next_trace_id());
      const uint64_t id = detail::trace_id(ArrayAccess::blocks(a)[p]);
      if (id != 0) line_by_block[id] = index;
    }
  }

  // A shard_map of the trace (JitTracer::shard_map): run, with its bodies recorded, and added
  // as a ShardMapStep after the reshards placing its arguments.
  std::vector<Array> record_shard_map(const ErasedBody& body, const Mesh& mesh,
                                      const std::vector<PartitionSpec>& in_specs,
                                      const std::vector<PartitionSpec>& out_specs,
                                      const std::vector<Array>& args,
                                      const ShardMapOptions& options);
  // A shard_map step recorded earlier in this trace, kept for what later bodies read of it.
  struct ShardMapRecord {
    size_t step = 0;  // in prog->steps
    std::optional<Mesh> mesh;
    std::vector<std::unique_ptr<BodyRecorder>> bodies;  // per position (another process's: null)
    bool uniform = true;     // every position's BodyProgram the same ops (BodyProgram::same_as)
    bool same_attrs = true;  // and with the same attributes (one compiled run serves all)
    std::map<int, int> exported;  // body value -> the value (vid) it leaves the step as
    // Not uniform: (position, body value) -> the value (vid) it leaves the step as at that
    // position (the step's other positions give no block for it).
    std::map<std::pair<size_t, int>, int> exported_at;
  };
  // The value (vid) block `t` is as a block that earlier shard_map step `r` made or read, read
  // at position `pos` of a step on `mesh`, or -1 when it is none.
  int exported_from(ShardMapRecord& r, const Tensor& t, const Mesh& mesh, size_t pos);

  void launched_local(const Mesh& mesh, const std::vector<Array>& placed, const global::LocalFn& fn,
                      std::vector<Array>& outs, bool concurrent) override;
  void launched_blocks(const Mesh& mesh, const std::vector<Array>& placed, const global::Body& body,
                       std::vector<Array>& outs, const global::AxisList* psum) override;
  void resharded(const Array& in, const Sharding& to, Array& out) override;

  // Installs the tracer and this observer on the calling thread; uninstall() puts back what was
  // there.
  void install() {
    scope.emplace(TraceScope::jit, tracer);
    previous_observer = global::set_launch_observer(this);
  }
  void uninstall() {
    global::set_launch_observer(previous_observer);
    scope.reset();
  }

  std::shared_ptr<JitProgram> prog;
  // Inputs' and steps' blocks by name: the trace ids the trace gave them (Tensor::trace_id, shared
  // by every copy of a block's Tensor). The trace names an input's blocks afresh, so a block
  // passed twice is two inputs and a captured Array is a constant, and names each block a launch
  // makes as the launch returns it (LaunchObserver).
  std::unordered_map<uint64_t, Ref> named;
  std::map<ConstantKey, Ref> constants;             // constants' blocks, by constant_key
  std::unordered_map<uint64_t, int> line_by_block;  // a traced op's results' blocks: its line
  std::vector<ShardMapRecord> shard_maps;           // in the order they ran
  // What body tasks touch of the recorder while a shard_map records (every body at once): the
  // exports (prog->values, earlier steps' results), body_buffers, jit's Array read checks.
  std::mutex body_mu;
  // The memory of every value a shard_map body of the trace computed or was given (each held by
  // its body's recorder until the trace ends, so no other block can come to use it).
  std::unordered_set<const void*> body_buffers;
  bool body_value(const Tensor& t) {
    std::lock_guard<std::mutex> lock(body_mu);
    return t.valid() && body_buffers.count(TensorAccess::buffer(t).get()) != 0;
  }
  CollectiveLog log;
  std::optional<CollectiveLog::Recording> recording;
  size_t log_seen = 0;
  JitTracer tracer;
  std::optional<TraceScope> scope;  // the trace's tracer, while installed
  global::LaunchObserver* previous_observer = nullptr;
};

void JitTracer::record(OpId op, std::span<const Array* const> inputs, std::span<Array> outputs,
                       const OpAttrs&) {
  bool follows = false;
  for (const Array* x : inputs) {
    follows = follows || followed_.count(detail::trace_id(*x)) != 0 || rec_->any_known(*x);
  }
  if (op == OpId::device_put && !inputs.empty() && outputs.size() == 1) {
    // runtime/'s device_put makes no global-view launch: it is a step of its own.
    const Array& x = *inputs.front();
    rec_->add_step(reshard_step(x, outputs.front().sharding()), {x}, outputs);
  }
  JitLine line;
  line.op = std::string(meshrt::detail::op_name(op));
  for (const Array* x : inputs) {
    line.ins.push_back(aval(*x));
    line.in_from.push_back(rec_->from_of(*x));
  }
  const int index = static_cast<int>(rec_->prog->lines.size());
  for (Array& y : outputs) {
    line.outs.push_back(aval(y));
    if (follows && !rec_->computed(y)) {
      throw Error(cat("[jit] the op '", line.op,
                      "' is not supported inside a jitted function yet (it computes its result "
                      "without a global-view launch jit can record); call it outside jit"));
    }
    if (rec_->computed(y) || follows) follow(y);
    rec_->set_line(y, index);
    if (!ArrayAccess::blocks(y).empty() && ArrayAccess::blocks(y).front().valid()) {
      if (const Ref* r = rec_->find(ArrayAccess::blocks(y).front()))
        line.out_vids.push_back(r->vid);
    }
  }
  std::vector<CollectiveLog::Entry> entries = rec_->log.entries();
  for (size_t i = rec_->log_seen; i < entries.size(); ++i) line.collectives.push_back(entries[i]);
  rec_->log_seen = entries.size();
  rec_->prog->lines.push_back(std::move(line));
}

// ---- the launches (global/launch.h)

namespace {

// Records the kernels `fn` calls on the first position this process holds, when every position
// here has operands and results of the same shapes and dtypes (then one program serves all).
// `loose`/`value`: per operand, whether it is an input or a constant of the program, and its
// value (loose_operands_share_memory).
void compile_local(LocalStep& s, const Mesh& mesh, const std::vector<Array>& placed,
                   const std::vector<Array>& outs, const std::vector<char>& loose,
                   const std::vector<int>& value) {
  const std::vector<Device>& devs = mesh.devices();
  std::optional<size_t> first;
  for (size_t pos = 0; pos < devs.size(); ++pos) {
    if (!is_local(devs[pos])) continue;
    if (!first) {
      first = pos;
      continue;
    }
    auto same = [&](const std::vector<Array>& arrays) {
      for (const Array& a : arrays) {
        const Tensor& x = ArrayAccess::blocks(a)[*first];
        const Tensor& y = ArrayAccess::blocks(a)[pos];
        if (x.shape() != y.shape() || x.dtype() != y.dtype()) return false;
      }
      return true;
    };
    if (!same(placed) || !same(outs)) {
      s.why_not = "blocks of different shapes on different devices";
      return;
    }
  }
  if (!first) return;
  std::vector<Tensor> ins;
  for (const Array& a : placed) ins.push_back(ArrayAccess::blocks(a)[*first]);
  if (loose_operands_share_memory(ins, loose, value)) {
    s.why_not = "operands that share memory";
    return;
  }
  KernelRecord r = record_kernels(s.fn, ins);
  s.kernels = std::move(r.program);
  s.why_not = std::move(r.why_not);
}

}  // namespace

void JitRecorder::launched_local(const Mesh& mesh, const std::vector<Array>& placed,
                                 const global::LocalFn& fn, std::vector<Array>& outs,
                                 bool concurrent) {
  LocalStep l;
  l.fn = fn;
  l.concurrent = concurrent;
  std::vector<char> loose;
  std::vector<int> value;
  for (const Array& a : placed) {
    const Ref r = refs_of(a).front();
    const JitValue& v = prog->values[static_cast<size_t>(r.vid)];
    loose.push_back(v.input >= 0 || v.constant ? 1 : 0);
    value.push_back(r.vid);
  }
  compile_local(l, mesh, placed, outs, loose, value);
  JitStep s;
  s.op = std::move(l);
  s.mesh = mesh;
  add_step(std::move(s), placed, outs);
}

namespace {

// Whether the replay may fold the psum over `axes` itself (see JitStep::host_psum).
void plan_host_psum(BlocksStep& s, const Mesh& mesh, const Array& x, const global::AxisList& axes) {
  const std::vector<Device>& devs = mesh.devices();
  for (const Device& d : devs) {
    if (!is_local(d)) return;
  }
  if (!backend_of(devs.front()).host_addressable()) return;
  const Tensor& b = ArrayAccess::blocks(x).front();
  if (static_cast<int64_t>(b.nbytes()) > coll::kSmallReduceBytes) return;
  for (const Tensor& t : ArrayAccess::blocks(x)) {
    if (t.shape() != b.shape() || t.dtype() != b.dtype()) return;
  }
  const std::string algo = config::collective_algo();
  if (algo != "auto" && algo != "direct") return;  // another algorithm folds in another order
  std::vector<int> positions;
  for (const std::string& a : axes) {
    positions.push_back(mesh.axis_position(a));
    if (positions.back() < 0) return;
  }
  coll::GroupLayout g = coll::make_group_layout(mesh.shape(), positions);
  s.groups = std::move(g.members);
  s.block_shape = b.shape();
  s.dtype = b.dtype();
  s.host_psum = true;
}

}  // namespace

void JitRecorder::launched_blocks(const Mesh& mesh, const std::vector<Array>& placed,
                                  const global::Body& body, std::vector<Array>& outs,
                                  const global::AxisList* psum) {
  BlocksStep b;
  b.body = body;
  if (psum != nullptr && !psum->empty() && placed.size() == 1) {
    plan_host_psum(b, mesh, placed.front(), *psum);
    const Array& x = placed.front();
    const Tensor* first = nullptr;
    bool same = true;
    for (const Tensor& t : ArrayAccess::blocks(x)) {
      if (!t.valid()) continue;
      if (first == nullptr) first = &t;
      same = same && t.shape() == first->shape() && t.dtype() == first->dtype();
    }
    if (first != nullptr && same) {
      b.psum_axes = *psum;
      b.block_shape = first->shape();
      b.dtype = first->dtype();
    }
  }
  JitStep s;
  s.op = std::move(b);
  s.mesh = mesh;
  add_step(std::move(s), placed, outs);
}

void JitRecorder::resharded(const Array& in, const Sharding& to, Array& out) {
  // The same value moved onto the same sharding again (the matmul gradient gathers dz for dx
  // and again for dW): the replay reuses the first move's result, whose bits are the same. The
  // refs name the blocks; Arrays holding the same blocks may still differ in sharding, shape,
  // dtype or pending sums (an Array and its raw addends, an Array moved onto a one-device mesh),
  // so those are compared too.
  const std::vector<Ref> from = refs_of(in);
  for (const JitStep& prev : prog->steps) {
    const ReshardStep* r = prev.reshard();
    if (r != nullptr && prev.in.front() == from && r->to == to && r->from == in.sharding() &&
        r->shape == in.shape() && r->dtype == in.dtype() && r->pending == in.pending_sum_axes()) {
      name_blocks(out, prev.out.front());
      return;
    }
  }
  add_step(reshard_step(in, to), {in}, std::span<Array>(&out, 1));
}

// ---- shard_map inside the jitted function (global/jit_shard_map.h)

std::optional<std::vector<Array>> JitTracer::shard_map(RunShardMap, const ErasedBody& body,
                                                       const Mesh& mesh,
                                                       const std::vector<PartitionSpec>& in_specs,
                                                       const std::vector<PartitionSpec>& out_specs,
                                                       const std::vector<Array>& args,
                                                       const ShardMapOptions& options) {
  std::vector<Array> outs = rec_->record_shard_map(body, mesh, in_specs, out_specs, args, options);
  for (Array& y : outs) follow(y);
  return outs;
}

void JitTracer::check_array_read(const Array& a, std::string_view what) {
  Tracer::check_array_read(a, what);
  if (rec_->any_known(a)) throw_not_known(what);
}

void JitTracer::check_tensor_read(const Tensor& t, std::string_view what) {
  Tracer::check_tensor_read(t, what);
  if (rec_->body_value(t)) throw_body_value_read(what);
}

void JitTracer::record(OpId op, std::span<const Tensor* const> inputs, std::span<Tensor>,
                       const OpAttrs&) {
  for (const Tensor* x : inputs) {
    if (!rec_->body_value(*x)) continue;
    throw Error(cat("[jit] the Tensor op '", op_name(op),
                    "' ran outside any shard_map body on a value a body computed or was given; "
                    "under jit a body's values exist only in its recording (it replays them on "
                    "new inputs), so the op's result would be the trace's: compute it inside "
                    "the body, or return it from the body and use the Array"));
  }
}

namespace {

size_t position_of(const Mesh& mesh, const Device& d) {
  const std::vector<Device>& devs = mesh.devices();
  return static_cast<size_t>(std::find(devs.begin(), devs.end(), d) - devs.begin());
}

bool same_blocks(const Array& a, const Array& b) {
  const std::vector<Tensor>& x = ArrayAccess::blocks(a);
  const std::vector<Tensor>& y = ArrayAccess::blocks(b);
  if (x.size() != y.size() || a.sharding() != b.sharding()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if ((x[i].valid() || y[i].valid()) && !same_view(x[i], y[i])) return false;
  }
  return true;
}

// "psum over ('x', 'y'): float32[4,8]" for a body's collective.
std::string collective_note(const BodyProgram& b, const BodyOp& op) {
  const std::vector<std::string>& axes = collective_axes(op.attrs);
  std::string s = cat(op_name(op.op), " over (");
  for (size_t i = 0; i < axes.size(); ++i) s += cat(i ? ", " : "", quote(axes[i]));
  s += axes.size() == 1 ? ",)" : ")";
  auto aval_of = [&](int v) {
    const ResultMeta& m = b.meta[static_cast<size_t>(v)];
    return type_str(m.dtype, m.shape);
  };
  s += cat(": ", aval_of(op.in.front()), " -> ", aval_of(op.out.front()), " per device");
  return s;
}

}  // namespace

int JitRecorder::exported_from(ShardMapRecord& r, const Tensor& t, const Mesh& mesh, size_t pos) {
  // Only the position of r's mesh on this device can hold `t` (a body's Tensors are its device's).
  const std::vector<Device>& devs = r.mesh->devices();
  const auto q =
      static_cast<size_t>(std::find(devs.begin(), devs.end(), mesh.devices()[pos]) - devs.begin());
  if (q == devs.size() || r.bodies[q] == nullptr) return -1;
  const int v = r.bodies[q]->find(t);
  if (v < 0) return -1;
  if (devs != mesh.devices()) {
    throw Error(
        "[jit] a shard_map body under jit reads a value an earlier shard_map body computed over a "
        "mesh of other devices or in another order; jit passes such values between bodies over "
        "the same devices in the same order only: use one mesh for both shard_maps, or call "
        "them outside jit");
  }
  JitStep& step = prog->steps[r.step];
  ShardMapStep& sm = *step.shard_map();
  if (r.uniform) {  // the same value at every position: one value of the program
    if (auto it = r.exported.find(v); it != r.exported.end()) return it->second;
  } else if (auto it = r.exported_at.find({pos, v}); it != r.exported_at.end()) {
    return it->second;
  }
  // A new result of the earlier step: at every position when the bodies ran the same ops (the
  // value is then the same at each), else at this position only (the others give no block).
  const int vid = new_value(static_cast<int>(devs.size()));
  size_t& bytes = prog->values[static_cast<size_t>(vid)].block_bytes;
  for (size_t p = 0; p < r.bodies.size(); ++p) {
    if (r.bodies[p] == nullptr) continue;
    const bool here = r.uniform || p == pos;
    sm.bodies[p].results.push_back(here ? v : -1);
    if (here) bytes = std::max(bytes, r.bodies[p]->held()[static_cast<size_t>(v)].nbytes());
  }
  step.out.push_back(vid);
  if (r.uniform) {
    sm.exported.push_back(v);
    r.exported.emplace(v, vid);
  } else {
    sm.exported.push_back(-1);
    r.exported_at.emplace(std::make_pair(pos, v), vid);
  }
  return vid;
}

std::vector<Array> JitRecorder::record_shard_map(const ErasedBody& body, const Mesh& mesh,
                                                 const std::vector<PartitionSpec>& in_specs,
                                                 const std::vector<PartitionSpec>& out_specs,
                                                 const std::vector<Array>& args,
                                                 const ShardMapOptions& options) {
  Untraced off;  // what runs here is the shard_map's machinery, not the function's ops
  JitLine line;
  line.op = options.name.empty() ? "shard_map" : cat("shard_map[", options.name, "]");
  for (const Array& x : args) {
    line.ins.push_back(aval(x));
    line.in_from.push_back(from_of(x));
  }
  // Step 1 (eager's place_inputs): a reshard step per argument that moves.
  std::vector<Array> placed = place_inputs(mesh, in_specs, args, options);
  for (size_t i = 0; i < args.size(); ++i) {
    if (!same_blocks(placed[i], args[i])) {
      line.notes.push_back(
          cat("args[", i, "] moved to ", in_specs[i].str(), " for in_specs[", i, "]"));
      Array moved = placed[i];
      add_step(reshard_step(args[i], moved.sharding()), {args[i]}, std::span<Array>(&moved, 1));
      placed[i] = moved;
    }
  }
  const size_t moved_notes = line.notes.size();
  // Step 2: the bodies, each recorded on its device's task.
  const size_t n = static_cast<size_t>(mesh.size());
  ShardMapRecord rec;
  rec.mesh = mesh;
  rec.bodies.resize(n);
  std::vector<int> outside;       // per extra operand of the step: its value (vid)
  std::map<int, size_t> slot_of;  // value (vid) -> its operand slot
  for (size_t pos = 0; pos < n; ++pos) {
    if (!is_local(mesh.devices()[pos])) continue;
    BodyRecorder::Hooks hooks;
    hooks.outside = [this, &outside, &slot_of, &mesh, pos,
                     args_n = placed.size()](const Tensor& t) -> int {
      std::lock_guard<std::mutex> lock(body_mu);
      for (auto r = shard_maps.rbegin(); r != shard_maps.rend(); ++r) {
        const int vid = exported_from(*r, t, mesh, pos);
        if (vid < 0) continue;
        auto [it, added] = slot_of.emplace(vid, args_n + outside.size());
        if (added) outside.push_back(vid);
        return static_cast<int>(it->second);
      }
      return -1;
    };
    hooks.note = [this](const Tensor& t) {
      std::lock_guard<std::mutex> lock(body_mu);
      body_buffers.insert(TensorAccess::buffer(t).get());
    };
    hooks.noted = [this](const Tensor& t) { return body_value(t); };
    hooks.array_read = [this](const Array& a, std::string_view what) {
      std::lock_guard<std::mutex> lock(body_mu);
      tracer.check_array_read(a, what);
    };
    rec.bodies[pos] = std::make_unique<BodyRecorder>(std::move(hooks), &tracer);
  }
  ErasedBody recording = [&](Context& ctx, const std::vector<Tensor>& xs) {
    BodyRecorder& r = *rec.bodies[position_of(mesh, ctx.device())];
    // The body gets copies of its blocks, in memory nothing else views: the recorder knows
    // values by the memory they view too, and an argument passed twice, or a block the body
    // also captures, would be one value for it (no tracer is on this task yet: not recorded).
    std::vector<Tensor> ins;
    for (const Tensor& x : xs) ins.push_back(copy(x));
    TraceScope on(r);
    for (size_t i = 0; i < ins.size(); ++i) r.add_input(ins[i], i);
    std::vector<Tensor> outs = body(ctx, ins);
    r.set_results(outs);
    return outs;
  };
  std::vector<std::vector<Tensor>> outputs = run_bodies(mesh, recording, placed);
  for (std::unique_ptr<BodyRecorder>& r : rec.bodies) {
    if (r != nullptr) r->finish();
  }
  // Step 3: the results, checked and assembled as eager's.
  std::vector<Array> results = assemble_outputs(mesh, out_specs, std::move(outputs), options);

  ShardMapStep sm;
  sm.out_specs = out_specs;
  sm.options = options;
  sm.args = placed.size();
  sm.bodies.resize(n);
  const BodyProgram* first = nullptr;
  for (size_t pos = 0; pos < n; ++pos) {
    if (rec.bodies[pos] == nullptr) continue;
    sm.bodies[pos] = rec.bodies[pos]->program();
    sm.bodies[pos].inputs.resize(placed.size() + outside.size(), -1);
    if (first == nullptr) {
      first = &sm.bodies[pos];
      for (const BodyOp& op : first->ops) {
        if (op_def(op.op).collective) line.notes.push_back(collective_note(*first, op));
      }
      line.notes.insert(line.notes.begin() + static_cast<std::ptrdiff_t>(moved_notes),
                        cat("body: ", first->ops.size(), " ops per device (",
                            first->constants.size(), " constants), replayed on every device"));
    }
    rec.uniform = rec.uniform && sm.bodies[pos].same_as(*first);
    rec.same_attrs = rec.same_attrs && sm.bodies[pos].same_as(*first, true);
  }
  if (!outside.empty()) {
    line.notes.push_back(cat("reads ", outside.size(),
                             " values of earlier shard_map bodies (a transpose body reads its "
                             "forward's), passed to it as operands"));
  }
  JitStep s;
  s.mesh = mesh;
  for (const Array& a : placed) s.in.push_back(refs_of(a));
  for (int vid : outside) {
    std::vector<Ref> refs;
    for (size_t pos = 0; pos < n; ++pos) refs.push_back(Ref{vid, static_cast<int>(pos)});
    s.in.push_back(std::move(refs));
  }
  for (Array& y : results) {
    const int vid = new_value(static_cast<int>(ArrayAccess::blocks(y).size()));
    s.out.push_back(vid);
    name_blocks(y, vid);
  }
  s.op = std::move(sm);
  prog->steps.push_back(std::move(s));
  rec.step = prog->steps.size() - 1;
  shard_maps.push_back(std::move(rec));

  const int index = static_cast<int>(prog->lines.size());
  for (Array& y : results) {
    line.outs.push_back(aval(y));
    set_line(y, index);
    if (const Ref* r = find(ArrayAccess::blocks(y).front())) line.out_vids.push_back(r->vid);
  }
  std::vector<CollectiveLog::Entry> entries = log.entries();
  for (size_t i = log_seen; i < entries.size(); ++i) line.collectives.push_back(entries[i]);
  log_seen = entries.size();
  prog->lines.push_back(std::move(line));
  return results;
}

// ---- the trace

JitTrace::JitTrace(std::vector<Array>& inputs, std::vector<std::string> paths, std::string name)
    : rec_(std::make_unique<JitRecorder>(std::move(name))) {
  JitProgram& p = *rec_->prog;
  p.in_paths = std::move(paths);
  // Every argument is traced on its blocks under fresh names, on this trace's own Tensors: a
  // later call may pass unrelated Arrays where the trace got the same one twice, or one the
  // function also captures (a constant: the caller's Tensors keep their names).
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Array in = inputs[i];
    const int vid = rec_->new_value(static_cast<int>(ArrayAccess::blocks(in).size()));
    std::vector<Tensor> blocks = ArrayAccess::blocks(in);
    for (size_t pos = 0; pos < blocks.size(); ++pos) {
      detail::set_trace_id(blocks[pos], next_trace_id());
      rec_->named.emplace(detail::trace_id(blocks[pos]), Ref{vid, static_cast<int>(pos)});
    }
    inputs[i] = ArrayAccess::make(in.shape(), in.dtype(), in.sharding(), std::move(blocks),
                                  in.pending_sum_axes());
    p.values[static_cast<size_t>(vid)].input = static_cast<int>(i);
    p.input_vids.push_back(vid);
    rec_->grow_block_bytes(vid, inputs[i]);
    // A fresh id per input: the tracer follows it (the caller's Array keeps its own).
    detail::set_trace_id(inputs[i], 0);
    rec_->tracer.follow(inputs[i]);
    p.in_avals.push_back(aval(inputs[i]));
  }
  rec_->recording.emplace(rec_->log.record());
  rec_->install();
}

JitTrace::~JitTrace() {
  if (rec_) rec_->uninstall();
}

std::shared_ptr<const JitProgram> JitTrace::build_program(const std::vector<Array>& outputs,
                                                          std::vector<std::string> paths) {
  JitProgram& p = *rec_->prog;
  p.out_paths = std::move(paths);
  for (const Array& y : outputs) {
    if (ArrayAccess::blocks(y).empty()) {
      throw Error("[jit] the function returned an empty (default-constructed) Array");
    }
    JitOutput o;
    o.refs = rec_->refs_of(y);
    o.shape = y.shape();
    o.dtype = y.dtype();
    o.sharding = y.sharding();
    o.pending = y.pending_sum_axes();
    p.outputs.push_back(std::move(o));
    p.out_avals.push_back(aval(y));
    p.output_from.push_back(rec_->from_of(y));
  }
  // The shard_map bodies' runs of ops compiled, now that every result of their steps is known.
  for (JitRecorder::ShardMapRecord& r : rec_->shard_maps) {
    if (!r.same_attrs) continue;
    for (size_t pos = 0; pos < r.bodies.size(); ++pos) {
      if (r.bodies[pos] == nullptr) continue;
      compile_body_segments(*p.steps[r.step].shard_map(), pos, *r.bodies[pos]);
      break;
    }
  }
  jit_plan(p);
  std::shared_ptr<const JitProgram> out = rec_->prog;
  rec_->uninstall();
  rec_.reset();
  return out;
}

bool jit_inside_transform() { return tracing(); }

namespace {
void put_int(std::string& s, int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  s.append(buf, end);
  s += ',';
}
void put_names(std::string& s, const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    s += n;
    s += '\x1f';  // a byte no axis name needs, so that ("a", "b") and ("a,b") differ
  }
  s += '|';
}
}  // namespace

// Built by hand (no streams): it is computed for every argument of every call.
std::string jit_signature(const Array& x) {
  std::string s;
  s.reserve(64);
  s += dtype_name(x.dtype());
  s += '[';
  for (int64_t d : x.shape()) put_int(s, d);
  s += "]|";
  const Sharding& sh = x.sharding();
  for (const Device& d : sh.device_list()) {
    put_int(s, static_cast<int64_t>(d.kind()));
    put_int(s, d.id());
  }
  s += '|';
  if (const std::optional<NamedSharding> named = sh.as_named()) {
    for (int64_t d : named->mesh().shape()) put_int(s, d);
    put_names(s, named->mesh().axis_names());
    for (const PartitionSpec::Entry& e : named->spec().entries()) put_names(s, e);
  }
  s += '+';
  put_names(s, x.pending_sum_axes());
  return s;
}

}  // namespace meshrt::detail
