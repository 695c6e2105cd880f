// jit's engine: recording the global view's launches, replaying them per device, printing them.
#include "global/jit_program.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_set>

#include "core/error.h"
#include "core/strings.h"
#include "global/collective_log.h"
#include "global/jit_record.h"
#include "global/layout.h"
#include "runtime/detail/launch.h"
#include "runtime/detail/trace.h"

namespace meshrt::detail {

namespace {

// One device's block of a value: value id and mesh position.
struct Ref {
  int vid = -1;
  int pos = 0;
};

// Blocks are told apart by the memory they view (views of one block differ in offset or shape).
using BlockKey = std::tuple<const void*, size_t, Shape, int>;
BlockKey key_of(const Tensor& t) {
  return {t.buffer().get(), t.byte_offset(), t.shape(), static_cast<int>(t.dtype())};
}

std::string aval(const Array& a) {
  std::string s = cat(dtype_name(a.dtype()), "[");
  for (size_t i = 0; i < a.shape().size(); ++i) s += cat(i ? "," : "", a.shape()[i]);
  s += "]";
  if (a.sharding().mesh_or_null() == nullptr) return s + " " + a.sharding().str();
  return s + " " + global::layout_str(global::layout_of(a));
}

thread_local JitRecorder* t_recorder = nullptr;

}  // namespace

struct JitValue {
  int npos = 0;
  bool constant = false;
  int input = -1;              // the input leaf it is, or -1
  std::vector<Tensor> blocks;  // constants only
  bool keep_to_end = false;    // read from another position or returned: never dropped early
  size_t block_bytes = 0;      // the largest block
};

struct JitStep {
  enum Kind { local, blocks, reshard } kind = local;
  std::optional<Mesh> mesh;  // local, blocks
  global::LocalFn fn;
  global::Body body;
  std::vector<std::vector<Ref>> in;  // per operand, per position
  std::vector<int> out;              // value ids
  // reshard: the operand's metadata and the target
  Shape shape;
  DType dtype = DType::f32;
  std::optional<Sharding> from, to;
  std::vector<std::string> pending;
  std::vector<int> drop;  // values whose blocks at the running position are not read again
};

struct JitSegment {
  size_t begin = 0, end = 0;  // steps [begin, end)
  bool host = false;          // a reshard run from the caller
  bool inline_run = false;  // every device's steps from the caller's thread (tiny, no collectives)
};

struct JitLine {
  std::string op;
  std::vector<std::string> ins, outs;
  std::vector<int> in_from;  // per operand: producing line, -1 - k for input k, kConst
  std::vector<CollectiveLog::Entry> collectives;
};
constexpr int kConst = -1000000;

struct JitOutput {
  std::vector<Ref> refs;
  Shape shape;
  DType dtype = DType::f32;
  std::optional<Sharding> sharding;
  std::vector<std::string> pending;
};

class JitProgram {
 public:
  std::string name;
  std::vector<JitValue> values;
  std::vector<JitStep> steps;
  std::vector<int> input_vids;
  std::vector<std::string> in_paths, in_avals, out_paths, out_avals;
  std::vector<JitOutput> outputs;
  std::vector<int> output_from;  // per output: producing line (as JitLine::in_from)
  std::vector<JitSegment> segments;
  std::vector<JitLine> lines;
};

// The tracer half of a trace: follows every value the program computes (so reading one on the
// host is refused), and lists the ops for the program's text.
class JitTracer final : public Tracer {
 public:
  explicit JitTracer(JitRecorder* rec) : rec_(rec) {}
  void record(std::string_view, std::span<const Tensor* const>, std::span<Tensor>,
              const OpAttrs&) override {}
  void record(std::string_view op, std::span<const Array* const> inputs, std::span<Array> outputs,
              const OpAttrs& attrs) override;
  void check_read(uint64_t trace_id, std::string_view what) override {
    if (followed_.count(trace_id) == 0) return;
    throw Error(cat("[jit] ", what,
                    " of a value computed inside a jitted function: its value is not known at "
                    "trace time (jit records the function once and replays it on new inputs); "
                    "return the value from the function and read it after the call, or compute "
                    "it outside jit"));
  }
  std::optional<std::vector<Array>> shard_map(RunShardMap, const ErasedBody&, const Mesh&,
                                              const std::vector<PartitionSpec>&,
                                              const std::vector<PartitionSpec>&,
                                              const std::vector<Array>&,
                                              const ShardMapOptions&) override {
    throw_shard_map_in_jit();
  }
  void follow(Array& a) {
    if (a.trace_id() == 0) a.set_trace_id(next_trace_id());
    followed_.insert(a.trace_id());
  }

 private:
  JitRecorder* rec_;
  std::unordered_set<uint64_t> followed_;
};

class JitRecorder {
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
  void register_array(const Array& a, int vid) {
    for (const Tensor& t : a.blocks()) {
      size_t& b = prog->values[static_cast<size_t>(vid)].block_bytes;
      b = std::max(b, t.nbytes());
    }
    for (size_t p = 0; p < a.blocks().size(); ++p) {
      const Tensor& t = a.blocks()[p];
      if (known.emplace(key_of(t), Ref{vid, static_cast<int>(p)}).second) keep.push_back(t);
    }
  }
  // The blocks of `a` as refs; blocks nothing made are a constant of the program.
  std::vector<Ref> refs_of(const Array& a) {
    std::vector<Ref> refs;
    int constant = -1;
    for (size_t p = 0; p < a.blocks().size(); ++p) {
      auto it = known.find(key_of(a.blocks()[p]));
      if (it == known.end()) {
        if (constant < 0) {
          constant = new_value(static_cast<int>(a.blocks().size()));
          prog->values[static_cast<size_t>(constant)].constant = true;
          prog->values[static_cast<size_t>(constant)].blocks = a.blocks();
          register_array(a, constant);
        }
        refs.push_back(Ref{constant, static_cast<int>(p)});
      } else {
        refs.push_back(it->second);
      }
    }
    return refs;
  }
  // True when every block of `a` is an input's or a step's (not a constant's).
  bool computed(const Array& a) const {
    for (const Tensor& t : a.blocks()) {
      auto it = known.find(key_of(t));
      if (it == known.end() || prog->values[static_cast<size_t>(it->second.vid)].constant)
        return false;
    }
    return !a.blocks().empty();
  }
  bool any_known(const Array& a) const {
    for (const Tensor& t : a.blocks()) {
      auto it = known.find(key_of(t));
      if (it != known.end() && !prog->values[static_cast<size_t>(it->second.vid)].constant)
        return true;
    }
    return false;
  }
  void add_step(JitStep s, const std::vector<Array>& ins, const std::vector<Array>& outs) {
    for (const Array& a : ins) s.in.push_back(refs_of(a));
    for (const Array& a : outs) {
      const int vid = new_value(static_cast<int>(a.blocks().size()));
      s.out.push_back(vid);
      register_array(a, vid);
    }
    prog->steps.push_back(std::move(s));
  }
  int line_of(const Array& a) const {
    if (a.blocks().empty()) return kConst;
    auto it = line_by_block.find(key_of(a.blocks().front()));
    return it == line_by_block.end() ? kConst : it->second;
  }

  std::shared_ptr<JitProgram> prog;
  std::map<BlockKey, Ref> known;
  std::vector<Tensor> keep;  // every registered block stays alive while tracing (no address reuse)
  std::map<BlockKey, int> line_by_block;
  CollectiveLog log;
  std::optional<CollectiveLog::Recording> recording;
  size_t log_seen = 0;
  JitTracer tracer;
  TraceState state;
  TraceState* previous_state = nullptr;
  JitRecorder* previous_recorder = nullptr;
};

void JitTracer::record(std::string_view op, std::span<const Array* const> inputs,
                       std::span<Array> outputs, const OpAttrs&) {
  bool follows = false;
  for (const Array* x : inputs) {
    follows = follows || followed_.count(x->trace_id()) != 0 || rec_->any_known(*x);
  }
  if (op == "device_put" && !inputs.empty() && outputs.size() == 1) {
    // runtime/'s device_put makes no global-view launch: it is a step of its own.
    const Array& x = *inputs.front();
    JitStep s;
    s.kind = JitStep::reshard;
    s.shape = x.shape();
    s.dtype = x.dtype();
    s.from = x.sharding();
    s.pending = x.pending_sum_axes();
    s.to = outputs.front().sharding();
    rec_->add_step(std::move(s), {x}, {outputs.front()});
  }
  JitLine line;
  line.op = std::string(op);
  for (const Array* x : inputs) {
    line.ins.push_back(aval(*x));
    int from = rec_->line_of(*x);
    if (from == kConst) {
      auto it = rec_->known.find(key_of(x->blocks().front()));
      if (it != rec_->known.end()) {
        const int input = rec_->prog->values[static_cast<size_t>(it->second.vid)].input;
        if (input >= 0) from = -1 - input;
      }
    }
    line.in_from.push_back(from);
  }
  const int index = static_cast<int>(rec_->prog->lines.size());
  for (Array& y : outputs) {
    line.outs.push_back(aval(y));
    if (follows && !rec_->computed(y)) {
      throw Error(cat("[jit] the op '", op,
                      "' is not supported inside a jitted function yet (it computes its result "
                      "without a global-view launch jit can record); call it outside jit"));
    }
    if (rec_->computed(y) || follows) follow(y);
    for (const Tensor& t : y.blocks()) rec_->line_by_block[key_of(t)] = index;
  }
  std::vector<CollectiveLog::Entry> entries = rec_->log.entries();
  for (size_t i = rec_->log_seen; i < entries.size(); ++i) line.collectives.push_back(entries[i]);
  rec_->log_seen = entries.size();
  rec_->prog->lines.push_back(std::move(line));
}

// ---- the hooks (global/jit_record.h)

void jit_record_local(const Mesh& mesh, const std::vector<Array>& placed, const global::LocalFn& fn,
                      const std::vector<Array>& outs) {
  if (t_recorder == nullptr) return;
  JitStep s;
  s.kind = JitStep::local;
  s.mesh = mesh;
  s.fn = fn;
  t_recorder->add_step(std::move(s), placed, outs);
}

void jit_record_blocks(const Mesh& mesh, const std::vector<Array>& placed, const global::Body& body,
                       const std::vector<Array>& outs) {
  if (t_recorder == nullptr) return;
  JitStep s;
  s.kind = JitStep::blocks;
  s.mesh = mesh;
  s.body = body;
  t_recorder->add_step(std::move(s), placed, outs);
}

void jit_record_reshard(const Array& in, const Sharding& to, const Array& out) {
  if (t_recorder == nullptr) return;
  JitStep s;
  s.kind = JitStep::reshard;
  s.shape = in.shape();
  s.dtype = in.dtype();
  s.from = in.sharding();
  s.pending = in.pending_sum_axes();
  s.to = to;
  t_recorder->add_step(std::move(s), {in}, {out});
}

// ---- the trace

JitTrace::JitTrace(std::vector<Array>& inputs, std::vector<std::string> paths, std::string name)
    : rec_(std::make_unique<JitRecorder>(std::move(name))) {
  JitProgram& p = *rec_->prog;
  p.in_paths = std::move(paths);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int vid = rec_->new_value(static_cast<int>(inputs[i].blocks().size()));
    p.values[static_cast<size_t>(vid)].input = static_cast<int>(i);
    p.input_vids.push_back(vid);
    rec_->register_array(inputs[i], vid);
    // A fresh id per input: the tracer follows it (the caller's Array keeps its own).
    inputs[i].set_trace_id(0);
    rec_->tracer.follow(inputs[i]);
    p.in_avals.push_back(aval(inputs[i]));
  }
  rec_->recording.emplace(rec_->log.record());
  rec_->state.tracers.push_back(&rec_->tracer);
  rec_->state.jit = true;
  rec_->previous_state = set_trace_state(&rec_->state);
  rec_->previous_recorder = t_recorder;
  t_recorder = rec_.get();
}

JitTrace::~JitTrace() {
  if (!rec_) return;
  t_recorder = rec_->previous_recorder;
  set_trace_state(rec_->previous_state);
}

namespace {

// Drops steps whose results are never used, plans when blocks can be dropped, and groups the
// steps into launches.
void plan(JitProgram& p) {
  std::vector<bool> live(p.values.size(), false);
  for (const JitOutput& o : p.outputs) {
    for (const Ref& r : o.refs) {
      live[static_cast<size_t>(r.vid)] = true;
      p.values[static_cast<size_t>(r.vid)].keep_to_end = true;
    }
  }
  std::vector<JitStep> kept;
  for (size_t i = p.steps.size(); i-- > 0;) {
    JitStep& s = p.steps[i];
    const bool used = std::any_of(s.out.begin(), s.out.end(),
                                  [&](int v) { return live[static_cast<size_t>(v)]; });
    if (!used) continue;
    for (auto& refs : s.in) {
      for (const Ref& r : refs) live[static_cast<size_t>(r.vid)] = true;
    }
    kept.push_back(std::move(s));
  }
  std::reverse(kept.begin(), kept.end());
  p.steps = std::move(kept);

  // Last reader of each value (at the reader's own position); values read across positions or by
  // reshards (which read every position from the caller) stay until the call ends.
  std::vector<int> last(p.values.size(), -1);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const JitStep& s = p.steps[i];
    for (auto& refs : s.in) {
      for (size_t pos = 0; pos < refs.size(); ++pos) {
        JitValue& v = p.values[static_cast<size_t>(refs[pos].vid)];
        if (s.kind == JitStep::reshard || refs[pos].pos != static_cast<int>(pos)) {
          v.keep_to_end = true;
        }
        last[static_cast<size_t>(refs[pos].vid)] = static_cast<int>(i);
      }
    }
  }
  for (size_t v = 0; v < p.values.size(); ++v) {
    if (last[v] >= 0 && !p.values[v].keep_to_end && !p.values[v].constant) {
      p.steps[static_cast<size_t>(last[v])].drop.push_back(static_cast<int>(v));
    }
  }

  // Launches: consecutive steps on one mesh, split where a step reads another position's block
  // made in the same launch.
  std::vector<int> made_in(p.values.size(), -1);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const JitStep& s = p.steps[i];
    bool join = false;
    if (s.kind != JitStep::reshard && !p.segments.empty()) {
      const JitSegment& cur = p.segments.back();
      join = !cur.host && *p.steps[cur.begin].mesh == *s.mesh;
      for (auto& refs : s.in) {
        for (size_t pos = 0; join && pos < refs.size(); ++pos) {
          const Ref& r = refs[pos];
          if (r.pos != static_cast<int>(pos) &&
              made_in[static_cast<size_t>(r.vid)] == static_cast<int>(p.segments.size()) - 1) {
            join = false;
          }
        }
      }
    }
    if (join) {
      p.segments.back().end = i + 1;
    } else {
      p.segments.push_back(JitSegment{i, i + 1, s.kind == JitStep::reshard, false});
    }
    for (int v : s.out) made_in[static_cast<size_t>(v)] = static_cast<int>(p.segments.size()) - 1;
  }
  // Steps without collectives run from the caller's thread, device after device (as eager ops
  // do, minus their planning): on cpu each kernel then has every core (measured faster than one
  // task per device for both tiny programs and a DP MLP step, bench/bench_jit.cpp), and waking
  // every executor is paid only where a collective needs all devices at once. Consecutive steps
  // with collectives run as one task per device.
  std::vector<JitSegment> split;
  for (const JitSegment& seg : p.segments) {
    if (seg.host) {
      split.push_back(seg);
      continue;
    }
    for (size_t i = seg.begin; i < seg.end; ++i) {
      const bool inl = p.steps[i].kind == JitStep::local;
      if (i > seg.begin && split.back().inline_run == inl) {
        split.back().end = i + 1;
      } else {
        split.push_back(JitSegment{i, i + 1, false, inl});
      }
    }
  }
  p.segments = std::move(split);
}

}  // namespace

std::shared_ptr<const JitProgram> JitTrace::finish(const std::vector<Array>& outputs,
                                                   std::vector<std::string> paths) {
  JitProgram& p = *rec_->prog;
  p.out_paths = std::move(paths);
  for (const Array& y : outputs) {
    if (y.blocks().empty()) {
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
    int from = rec_->line_of(y);
    if (from == kConst) {
      auto it = rec_->known.find(key_of(y.blocks().front()));
      if (it != rec_->known.end()) {
        const int input = p.values[static_cast<size_t>(it->second.vid)].input;
        if (input >= 0) from = -1 - input;
      }
    }
    p.output_from.push_back(from);
  }
  plan(p);
  std::shared_ptr<const JitProgram> out = rec_->prog;
  t_recorder = rec_->previous_recorder;
  set_trace_state(rec_->previous_state);
  rec_.reset();
  return out;
}

// ---- replay

namespace {

using Values = std::vector<std::vector<Tensor>>;

void run_step_at(const JitStep& s, Values& vals, size_t pos, Context* ctx) {
  std::vector<Tensor> ins;
  ins.reserve(s.in.size());
  for (const auto& refs : s.in) {
    const Ref& r = refs[pos];
    ins.push_back(vals[static_cast<size_t>(r.vid)][static_cast<size_t>(r.pos)]);
  }
  std::vector<Tensor> outs = s.kind == JitStep::local ? s.fn(ins) : s.body(*ctx, ins);
  for (size_t o = 0; o < s.out.size(); ++o) {
    vals[static_cast<size_t>(s.out[o])][pos] = std::move(outs[o]);
  }
  for (int v : s.drop) vals[static_cast<size_t>(v)][pos] = Tensor();
}

Array gather(const std::vector<Ref>& refs, const Values& vals, const Shape& shape, DType dtype,
             const Sharding& sharding, const std::vector<std::string>& pending) {
  std::vector<Tensor> blocks;
  blocks.reserve(refs.size());
  for (const Ref& r : refs) {
    blocks.push_back(vals[static_cast<size_t>(r.vid)][static_cast<size_t>(r.pos)]);
  }
  return Array(shape, dtype, sharding, std::move(blocks), pending);
}

}  // namespace

std::vector<Array> jit_replay(const JitProgram& p, std::vector<Array> inputs,
                              const std::vector<bool>& donated) {
  (void)donated;
  Values vals(p.values.size());
  for (size_t v = 0; v < p.values.size(); ++v) {
    const JitValue& jv = p.values[v];
    if (jv.constant) {
      vals[v] = jv.blocks;
    } else {
      vals[v].resize(static_cast<size_t>(jv.npos));
    }
  }
  if (inputs.size() != p.input_vids.size()) {
    throw Error(
        cat("[jit] internal: ", inputs.size(), " inputs for a program of ", p.input_vids.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<Tensor>& dst = vals[static_cast<size_t>(p.input_vids[i])];
    const std::vector<Tensor>& src = inputs[i].blocks();
    if (src.size() != dst.size()) {
      throw Error(cat("[jit] internal: input ", i, " has ", src.size(), " blocks, the program ",
                      dst.size()));
    }
    dst = src;
  }
  inputs.clear();  // the program's copies are the only ones it keeps (donated buffers can go)

  for (const JitSegment& seg : p.segments) {
    if (seg.host) {
      const JitStep& s = p.steps[seg.begin];
      Array x = gather(s.in.front(), vals, s.shape, s.dtype, *s.from, s.pending);
      Array y = device_put(x, *s.to);
      vals[static_cast<size_t>(s.out.front())] = y.blocks();
      continue;
    }
    const Mesh& mesh = *p.steps[seg.begin].mesh;
    const size_t n = static_cast<size_t>(mesh.size());
    if (seg.inline_run) {
      for (size_t pos = 0; pos < n; ++pos) {
        for (size_t i = seg.begin; i < seg.end; ++i) run_step_at(p.steps[i], vals, pos, nullptr);
      }
      continue;
    }
    const std::vector<Device>& devs = mesh.devices();
    ErasedBody body = [&](Context& ctx, const std::vector<Tensor>&) {
      const Device d = ctx.device();
      size_t pos = 0;
      while (pos < devs.size() && devs[pos] != d) ++pos;
      for (size_t i = seg.begin; i < seg.end; ++i) run_step_at(p.steps[i], vals, pos, &ctx);
      return std::vector<Tensor>{};
    };
    (void)run_bodies(mesh, body, {});
  }

  std::vector<Array> out;
  out.reserve(p.outputs.size());
  for (const JitOutput& o : p.outputs) {
    out.push_back(gather(o.refs, vals, o.shape, o.dtype, *o.sharding, o.pending));
  }
  return out;
}

// ---- text and dot

namespace {

std::string line_ref(const JitProgram& p, int from) {
  if (from == kConst) return "const";
  if (from < 0) return p.in_paths[static_cast<size_t>(-1 - from)];
  return cat("%", from);
}

}  // namespace

std::string jit_text(const JitProgram& p) {
  std::string s = cat("jit(", p.name, ")\n");
  for (size_t i = 0; i < p.in_paths.size(); ++i) {
    s += cat("  in  ", p.in_paths[i], ": ", p.in_avals[i], "\n");
  }
  for (size_t k = 0; k < p.lines.size(); ++k) {
    const JitLine& l = p.lines[k];
    s += cat("  %", k, " = ", l.op, "(");
    for (size_t i = 0; i < l.ins.size(); ++i) {
      s += cat(i ? ", " : "", line_ref(p, l.in_from[i]), ": ", l.ins[i]);
    }
    s += ") -> ";
    for (size_t i = 0; i < l.outs.size(); ++i) s += cat(i ? ", " : "", l.outs[i]);
    s += "\n";
    for (const CollectiveLog::Entry& e : l.collectives) {
      s += cat("      ", e.collective, " ", e.from, " -> ", e.to, ", ", e.bytes_per_device,
               " bytes per device", e.note.empty() ? "" : " (" + e.note + ")", "\n");
    }
  }
  for (size_t i = 0; i < p.out_paths.size(); ++i) {
    s += cat("  out ", p.out_paths[i], " = ", line_ref(p, p.output_from[i]), ": ", p.out_avals[i],
             "\n");
  }
  size_t host = 0, device = 0, inline_runs = 0, collectives = 0;
  for (const JitSegment& seg : p.segments) {
    (seg.host ? host : seg.inline_run ? inline_runs : device) += 1;
  }
  for (const JitStep& st : p.steps) collectives += st.kind == JitStep::blocks ? 1 : 0;
  s += cat("  replay: ", p.steps.size(), " steps (", collectives, " with collectives) in ",
           p.segments.size(), " launches per call: ", device, " as one task per device, ",
           inline_runs, " on small blocks from the caller's thread, ", host,
           " reshards from the caller\n");
  return s;
}

namespace {
std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}
}  // namespace

std::string jit_dot(const JitProgram& p) {
  std::string s = cat("digraph \"jit(", esc(p.name), ")\" {\n  rankdir=TB;\n",
                      "  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  auto node_of = [&](int from) {
    if (from == kConst) return std::string("const");
    if (from < 0) return cat("in", -1 - from);
    return cat("op", from);
  };
  bool has_const = false;
  for (size_t i = 0; i < p.in_paths.size(); ++i) {
    s += cat("  in", i, " [shape=ellipse, label=\"", esc(p.in_paths[i]), "\\n", esc(p.in_avals[i]),
             "\"];\n");
  }
  for (size_t k = 0; k < p.lines.size(); ++k) {
    const JitLine& l = p.lines[k];
    std::string outs;
    for (size_t i = 0; i < l.outs.size(); ++i) outs += (i ? "\\n" : "") + esc(l.outs[i]);
    s += cat("  op", k, " [label=\"%", k, " ", esc(l.op), "\\n", outs, "\"];\n");
    for (size_t c = 0; c < l.collectives.size(); ++c) {
      const CollectiveLog::Entry& e = l.collectives[c];
      s += cat("  op", k, "_c", c,
               " [shape=octagon, style=filled, fillcolor=\"#ff9999\", color=red, label=\"",
               esc(e.collective), "\\n", e.bytes_per_device, " B/device\\n", esc(e.from), " -> ",
               esc(e.to), "\"];\n");
      s += cat("  op", k, "_c", c, " -> op", k, " [color=red];\n");
    }
    for (size_t i = 0; i < l.in_from.size(); ++i) {
      has_const = has_const || l.in_from[i] == kConst;
      const std::string target = l.collectives.empty() ? cat("op", k) : cat("op", k, "_c0");
      s += cat("  ", node_of(l.in_from[i]), " -> ", target, ";\n");
    }
  }
  for (size_t i = 0; i < p.out_paths.size(); ++i) {
    has_const = has_const || p.output_from[i] == kConst;
    s += cat("  out", i, " [shape=ellipse, label=\"", esc(p.out_paths[i]), "\\n",
             esc(p.out_avals[i]), "\"];\n");
    s += cat("  ", node_of(p.output_from[i]), " -> out", i, ";\n");
  }
  if (has_const) s += "  const [shape=plaintext, label=\"constant\"];\n";
  return s + "}\n";
}

bool jit_inside_transform() { return tracing(); }

std::string jit_signature(const Array& x) {
  std::string s = cat(dtype_name(x.dtype()), shape_str(x.shape()), "|");
  const Sharding& sh = x.sharding();
  for (const Device& d : sh.device_list()) s += d.str() + ",";
  s += "|" + sh.str();
  for (const std::string& a : x.pending_sum_axes()) s += "+" + a;
  return s;
}

}  // namespace meshrt::detail
