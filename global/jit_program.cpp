// jit's engine: recording the global view's launches, replaying them per device, printing them.
#include "global/jit_program.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_set>

#include "collectives/direct.h"
#include "collectives/groups.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "global/collective_log.h"
#include "global/jit_record.h"
#include "global/layout.h"
#include "runtime/detail/kernel_tape.h"
#include "runtime/detail/launch.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/trace.h"
#include "runtime/tensor_ops.h"

namespace meshrt::detail {

namespace {

// One device's block of a value: value id and mesh position.
struct Ref {
  int vid = -1;
  int pos = 0;
  bool operator==(const Ref&) const = default;
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
  size_t first = 0;            // its first block's index in a replay's flat tables
  // Made by a compiled step and read only by compiled steps at the same position: its blocks
  // live in the program's planned buffers (no Tensor per call); else every block is a Tensor.
  bool planned = false;
  int home = -1;        // planned: its buffer (of its maker's mesh)
  int64_t home_at = 0;  // planned: its offset in that buffer
};

struct JitStep {
  enum Kind { local, blocks, reshard } kind = local;
  std::optional<Mesh> mesh;  // local, blocks
  int mesh_index = -1;       // local, blocks: into JitProgram::meshes
  global::LocalFn fn;
  bool concurrent = false;  // local: large blocks, computed on every device's executor at once
  // local: the kernels fn calls, recorded at trace time (null: fn itself runs; why_not says why)
  std::shared_ptr<const KernelProgram> kernels;
  std::string why_not;
  // per temporary of `kernels`: its planned buffer (an index into the mesh's buffers), or -1 - j
  // when it holds a result that leaves the compiled steps (the j-th of `fresh` buffers allocated
  // per call, since a Tensor keeps it)
  std::vector<int> temp_home;
  size_t fresh = 0;
  // (temporary, operand): a temporary that leaves may take the operand's buffer instead of a new
  // one, when the operand is a donated input read here for the last time, this call holds its
  // only reference, and the kernels allow it (KernelProgram::may_write_over): in-place donation.
  std::vector<std::pair<uint32_t, uint32_t>> reuse;
  std::vector<uint32_t> dyn_operands;  // compiled: operands whose address changes per call
  global::Body body;
  // blocks: a psum of the operand over mesh axes that the replay folds from the caller's thread
  // (host memory, every device in this process, small blocks): the direct algorithm's fold, in
  // the same member order, so the same bits, without waking the executors.
  bool host_psum = false;
  std::vector<std::vector<int64_t>> groups;  // host_psum: per group, its members' positions
  Shape block_shape;                         // host_psum, psum_axes: of every block
  // blocks: the body is exactly a psum of its one operand over these axes (a pending sum
  // resolved), blocks of block_shape and dtype; empty otherwise.
  global::AxisList psum_axes;
  // blocks, device platforms: steps [this one, bucket_end) are psums over the same axes that the
  // replay takes as one collective over their blocks laid end to end (plan_psum_buckets).
  size_t bucket_end = 0;
  std::vector<std::vector<Ref>> in;  // per operand, per position
  std::vector<int> out;              // value ids
  // reshard: the operand's metadata and the target
  Shape shape;
  DType dtype = DType::f32;
  std::optional<Sharding> from, to;
  std::vector<std::string> pending;
  std::vector<int> drop;  // values whose blocks at the running position are not read again
  // Flat table indices (JitValue::first + position), computed once: in_flat[pos * operands + i]
  // is operand i's block at pos; out_first[o] is result o's first block.
  std::vector<uint32_t> in_flat;
  std::vector<uint32_t> out_first;
};

struct JitSegment {
  size_t begin = 0, end = 0;  // steps [begin, end)
  bool host = false;          // a reshard run from the caller
  bool inline_run = false;  // every device's steps from the caller's thread (tiny, no collectives)
  bool fold = false;        // one host_psum step
};

struct JitLine {
  std::string op;
  std::vector<std::string> ins, outs;
  std::vector<int> in_from;  // per operand: producing line, -1 - k for input k, kConst
  std::vector<CollectiveLog::Entry> collectives;
  std::vector<int> out_vids;  // its results' values, where a step made them
  bool replayed = true;       // false when plan() dropped every step making its results
};
constexpr int kConst = -1000000;

struct JitOutput {
  std::vector<Ref> refs;
  Shape shape;
  DType dtype = DType::f32;
  std::optional<Sharding> sharding;
  std::vector<std::string> pending;
};

// One call's working memory, kept by the program and reused by later calls (a call takes one
// that is free, or makes one): the flat tables of blocks, the planned buffers of each mesh
// position, the kernels' stride scratch.
struct JitArena {
  std::vector<Tensor> vals;  // per value and position (value.first + pos)
  std::vector<char*> ptrs;   // the same blocks' addresses (planned blocks': set once)
  // per compiled step and position: its kernels' slot addresses, the planned ones set once
  std::vector<std::vector<std::vector<char*>>> base;
  std::vector<std::vector<std::vector<std::shared_ptr<backend::Buffer>>>> bufs;  // [mesh][pos][k]
  std::vector<std::vector<std::vector<backend::Strided>>> scratch;               // [step][pos]
  std::vector<char> donated;  // per input leaf: donated by this call
};

// A mesh position's device, its backend (null for another process's) and local index.
struct JitPlace {
  Device device;
  backend::Backend* backend = nullptr;
  int local = 0;
};

class JitProgram {
 public:
  std::string name;
  std::vector<Mesh> meshes;                   // of the steps
  std::vector<std::vector<JitPlace>> places;  // per mesh, per position
  std::vector<std::vector<size_t>> planned;   // per mesh: the planned buffers' sizes
  size_t flat = 0;                            // blocks over all values
  mutable std::mutex arenas_mu;
  mutable std::vector<std::unique_ptr<JitArena>> arenas;  // free ones
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
  void record(OpId, std::span<const Tensor* const>, std::span<Tensor>, const OpAttrs&) override {}
  void record(OpId op, std::span<const Array* const> inputs, std::span<Array> outputs,
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

void JitTracer::record(OpId op, std::span<const Array* const> inputs, std::span<Array> outputs,
                       const OpAttrs&) {
  bool follows = false;
  for (const Array* x : inputs) {
    follows = follows || followed_.count(x->trace_id()) != 0 || rec_->any_known(*x);
  }
  if (op == OpId::device_put && !inputs.empty() && outputs.size() == 1) {
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
  line.op = std::string(meshrt::detail::op_name(op));
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
      throw Error(cat("[jit] the op '", line.op,
                      "' is not supported inside a jitted function yet (it computes its result "
                      "without a global-view launch jit can record); call it outside jit"));
    }
    if (rec_->computed(y) || follows) follow(y);
    for (const Tensor& t : y.blocks()) rec_->line_by_block[key_of(t)] = index;
    if (!y.blocks().empty() && y.blocks().front().valid()) {
      auto it = rec_->known.find(key_of(y.blocks().front()));
      if (it != rec_->known.end()) line.out_vids.push_back(it->second.vid);
    }
  }
  std::vector<CollectiveLog::Entry> entries = rec_->log.entries();
  for (size_t i = rec_->log_seen; i < entries.size(); ++i) line.collectives.push_back(entries[i]);
  rec_->log_seen = entries.size();
  rec_->prog->lines.push_back(std::move(line));
}

// ---- the hooks (global/jit_record.h)

namespace {

// Records the kernels `fn` calls on the first position this process holds, when every position
// here has operands and results of the same shapes and dtypes (then one program serves all).
void compile_local(JitStep& s, const std::vector<Array>& placed, const std::vector<Array>& outs) {
  const std::vector<Device>& devs = s.mesh->devices();
  std::optional<size_t> first;
  for (size_t pos = 0; pos < devs.size(); ++pos) {
    if (!is_local(devs[pos])) continue;
    if (!first) {
      first = pos;
      continue;
    }
    auto same = [&](const std::vector<Array>& arrays) {
      for (const Array& a : arrays) {
        const Tensor& x = a.blocks()[*first];
        const Tensor& y = a.blocks()[pos];
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
  for (const Array& a : placed) ins.push_back(a.blocks()[*first]);
  KernelRecord r = record_kernels(s.fn, ins);
  s.kernels = std::move(r.program);
  s.why_not = std::move(r.why_not);
}

}  // namespace

void jit_record_local(const Mesh& mesh, const std::vector<Array>& placed, const global::LocalFn& fn,
                      const std::vector<Array>& outs, bool concurrent) {
  if (t_recorder == nullptr) return;
  JitStep s;
  s.kind = JitStep::local;
  s.mesh = mesh;
  s.fn = fn;
  s.concurrent = concurrent;
  compile_local(s, placed, outs);
  t_recorder->add_step(std::move(s), placed, outs);
}

namespace {

// Whether the replay may fold the psum over `axes` itself (see JitStep::host_psum).
void plan_host_psum(JitStep& s, const Array& x, const global::AxisList& axes) {
  const std::vector<Device>& devs = s.mesh->devices();
  for (const Device& d : devs) {
    if (!is_local(d)) return;
  }
  if (!backend_of(devs.front()).host_addressable()) return;
  const Tensor& b = x.blocks().front();
  if (static_cast<int64_t>(b.nbytes()) > coll::kSmallReduceBytes) return;
  for (const Tensor& t : x.blocks()) {
    if (t.shape() != b.shape() || t.dtype() != b.dtype()) return;
  }
  const std::string algo = config::collective_algo();
  if (algo != "auto" && algo != "direct") return;  // another algorithm folds in another order
  std::vector<int> positions;
  for (const std::string& a : axes) {
    positions.push_back(s.mesh->axis_position(a));
    if (positions.back() < 0) return;
  }
  coll::GroupLayout g = coll::make_group_layout(s.mesh->shape(), positions);
  s.groups = std::move(g.members);
  s.block_shape = b.shape();
  s.dtype = b.dtype();
  s.host_psum = true;
}

}  // namespace

void jit_record_blocks(const Mesh& mesh, const std::vector<Array>& placed, const global::Body& body,
                       const std::vector<Array>& outs, const global::AxisList* psum) {
  if (t_recorder == nullptr) return;
  JitStep s;
  s.kind = JitStep::blocks;
  s.mesh = mesh;
  s.body = body;
  if (psum != nullptr && !psum->empty() && placed.size() == 1) {
    plan_host_psum(s, placed.front(), *psum);
    const Array& x = placed.front();
    const Tensor* first = nullptr;
    bool same = true;
    for (const Tensor& t : x.blocks()) {
      if (!t.valid()) continue;
      if (first == nullptr) first = &t;
      same = same && t.shape() == first->shape() && t.dtype() == first->dtype();
    }
    if (first != nullptr && same) {
      s.psum_axes = *psum;
      s.block_shape = first->shape();
      s.dtype = first->dtype();
    }
  }
  t_recorder->add_step(std::move(s), placed, outs);
}

void jit_record_reshard(const Array& in, const Sharding& to, const Array& out) {
  if (t_recorder == nullptr) return;
  // The same value moved onto the same sharding again (the matmul gradient gathers dz for dx
  // and again for dW): the replay reuses the first move's result, whose bits are the same. The
  // refs name the blocks; the source sharding, shape and dtype are compared too, so two views of
  // one set of blocks are never taken for each other.
  const std::vector<Ref> from = t_recorder->refs_of(in);
  for (const JitStep& prev : t_recorder->prog->steps) {
    if (prev.kind == JitStep::reshard && prev.in.front() == from && *prev.to == to &&
        *prev.from == in.sharding() && prev.shape == in.shape() && prev.dtype == in.dtype() &&
        prev.pending == in.pending_sum_axes()) {
      t_recorder->register_array(out, prev.out.front());
      return;
    }
  }
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
  // Every argument is traced on a copy of its blocks: the program tells its inputs apart from
  // each other and from Arrays the function captures (its constants) by memory, and a later call
  // may pass unrelated Arrays where the trace got the same one twice, or a captured one.
  for (Array& in : inputs) {
    std::vector<Tensor> blocks;
    for (const Tensor& t : in.blocks()) blocks.push_back(t.valid() ? meshrt::copy(t) : Tensor());
    in = Array(in.shape(), in.dtype(), in.sharding(), std::move(blocks), in.pending_sum_axes());
  }
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

// Whether a psum step may join a bucket: a device platform (each collective there costs a
// stream wait and a host round trip; host memory has host_psum), every device in this process,
// and the direct algorithm, whose sum of each element is the same whatever else is summed with
// it, so a bucket gives the separate psums' bits (a vendor library's may depend on the size).
bool bucketable(const JitStep& s) {
  if (s.kind != JitStep::blocks || s.host_psum || s.psum_axes.empty() || s.kernels != nullptr)
    return false;
  const std::vector<Device>& devs = s.mesh->devices();
  for (const Device& d : devs) {
    if (!is_local(d)) return false;
  }
  backend::Backend& be = backend_of(devs.front());
  if (be.host_addressable()) return false;
  const std::string algo = config::collective_algo();
  if (algo != "auto" && algo != "direct") return false;
  if (algo == "auto") {  // automatic picks the vendor library where it serves the group
    std::vector<int> positions;
    for (const std::string& a : s.psum_axes) positions.push_back(s.mesh->axis_position(a));
    for (const auto& group : coll::make_group_layout(s.mesh->shape(), positions).members) {
      std::vector<int> locals;
      for (int64_t m : group) locals.push_back(devs[static_cast<size_t>(m)].local_index());
      if (be.native_unavailable(locals).empty()) return false;
    }
  }
  return true;
}

// Consecutive psum steps of one launch over the same axes and dtype, none reading another's
// result, become one bucket (at most kBucketBytes per device): one collective instead of one each
// (the gradients of a data-parallel step, resolved one leaf after another).
void plan_psum_buckets(JitProgram& p) {
  constexpr int64_t kBucketBytes = int64_t{256} << 20;
  for (const JitSegment& seg : p.segments) {
    if (seg.host || seg.fold || seg.inline_run) continue;
    for (size_t i = seg.begin; i < seg.end;) {
      const JitStep& s = p.steps[i];
      if (!bucketable(s)) {
        ++i;
        continue;
      }
      std::set<int> made(s.out.begin(), s.out.end());
      int64_t bytes = shape_size(s.block_shape) * static_cast<int64_t>(dtype_size(s.dtype));
      size_t j = i + 1;
      for (; j < seg.end; ++j) {
        const JitStep& t = p.steps[j];
        if (!bucketable(t) || t.psum_axes != s.psum_axes || t.dtype != s.dtype) break;
        const int64_t b = shape_size(t.block_shape) * static_cast<int64_t>(dtype_size(t.dtype));
        if (bytes + b > kBucketBytes) break;
        bool reads_bucket = false;
        for (const Ref& r : t.in.front()) reads_bucket = reads_bucket || made.count(r.vid) != 0;
        if (reads_bucket) break;
        made.insert(t.out.begin(), t.out.end());
        bytes += b;
      }
      if (j - i >= 2) p.steps[i].bucket_end = j;
      i = j;
    }
  }
}

// Which values live in planned buffers, and the buffers: per mesh, greedily, a buffer of the same
// size freed by an earlier step is reused (a value's buffer is free after its last reader, a
// temporary's after its own step). `last`: each value's last reading step, or -1.
void plan_buffers(JitProgram& p, const std::vector<int>& last) {
  for (JitStep& s : p.steps) {
    if (s.kind == JitStep::reshard) continue;
    auto it = std::find(p.meshes.begin(), p.meshes.end(), *s.mesh);
    s.mesh_index = static_cast<int>(it - p.meshes.begin());
    if (it == p.meshes.end()) p.meshes.push_back(*s.mesh);
  }
  // Planned: made by a compiled step, read only by compiled steps on the same mesh at the same
  // position (keep_to_end covers the rest: results, reshards, other positions).
  std::vector<int> maker(p.values.size(), -1);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    for (int v : p.steps[i].out) maker[static_cast<size_t>(v)] = static_cast<int>(i);
  }
  for (size_t v = 0; v < p.values.size(); ++v) {
    const int m = maker[v];
    p.values[v].planned =
        m >= 0 && p.steps[static_cast<size_t>(m)].kernels != nullptr && !p.values[v].keep_to_end;
  }
  for (const JitStep& s : p.steps) {
    for (const auto& refs : s.in) {
      for (const Ref& r : refs) {
        JitValue& v = p.values[static_cast<size_t>(r.vid)];
        if (!v.planned) continue;
        const JitStep& m = p.steps[static_cast<size_t>(maker[static_cast<size_t>(r.vid)])];
        if ((s.kernels == nullptr && !s.host_psum) || s.mesh_index != m.mesh_index) {
          v.planned = false;
        }
      }
    }
  }
  // Results sharing a temporary share its fate: one that leaves makes them all leave.
  for (JitStep& s : p.steps) {
    if (s.kernels == nullptr) continue;
    const KernelProgram& k = *s.kernels;
    for (size_t r = 0; r < k.results.size(); ++r) {
      for (size_t q = 0; q < k.results.size(); ++q) {
        if (k.results[r].slot == k.results[q].slot &&
            !p.values[static_cast<size_t>(s.out[q])].planned) {
          p.values[static_cast<size_t>(s.out[r])].planned = false;
        }
      }
    }
  }
  p.planned.assign(p.meshes.size(), {});
  std::vector<std::multimap<size_t, int>> free(p.meshes.size());
  std::vector<std::vector<std::pair<int, int>>> release(p.steps.size());  // (mesh, buffer)
  for (size_t i = 0; i < p.steps.size(); ++i) {
    JitStep& s = p.steps[i];
    if (s.kernels != nullptr) {
      const KernelProgram& k = *s.kernels;
      const size_t m = static_cast<size_t>(s.mesh_index);
      s.temp_home.assign(k.temp_bytes.size(), 0);
      std::vector<int> until(k.temp_bytes.size(), static_cast<int>(i));
      for (size_t r = 0; r < k.results.size(); ++r) {
        const size_t t = static_cast<size_t>(k.results[r].slot - k.operands);
        const int v = s.out[r];
        if (!p.values[static_cast<size_t>(v)].planned && s.temp_home[t] >= 0) {
          s.temp_home[t] = -1 - static_cast<int>(s.fresh++);
        }
        until[t] = std::max(until[t], last[static_cast<size_t>(v)]);
      }
      for (size_t t = 0; t < k.temp_bytes.size(); ++t) {
        if (s.temp_home[t] < 0) continue;
        const size_t bytes = k.temp_bytes[t];
        auto f = free[m].find(bytes);
        int b = 0;
        if (f != free[m].end()) {
          b = f->second;
          free[m].erase(f);
        } else {
          b = static_cast<int>(p.planned[m].size());
          p.planned[m].push_back(bytes);
        }
        s.temp_home[t] = b;
        release[static_cast<size_t>(until[t])].push_back({static_cast<int>(m), b});
      }
      for (size_t r = 0; r < k.results.size(); ++r) {
        JitValue& v = p.values[static_cast<size_t>(s.out[r])];
        if (!v.planned) continue;
        v.home = s.temp_home[static_cast<size_t>(k.results[r].slot - k.operands)];
        v.home_at = k.results[r].offset;
      }
      // In-place donation: inputs read here for the last time, of a leaving temporary's size.
      for (size_t t = 0; t < k.temp_bytes.size(); ++t) {
        if (s.temp_home[t] >= 0) continue;
        for (size_t o = 0; o < s.in.size(); ++o) {
          const int vid = s.in[o].front().vid;
          const JitValue& v = p.values[static_cast<size_t>(vid)];
          // One value at every position, and not also another operand (f(w, w): the kernels
          // read it through both slots, and may_write_over sees one).
          const bool one_value =
              std::all_of(s.in[o].begin(), s.in[o].end(),
                          [&](const Ref& r) { return r.vid == vid; }) &&
              std::none_of(s.in.begin(), s.in.end(), [&](const std::vector<Ref>& other) {
                return &other != &s.in[o] &&
                       std::any_of(other.begin(), other.end(),
                                   [&](const Ref& r) { return r.vid == vid; });
              });
          if (!one_value || v.input < 0 || v.keep_to_end ||
              last[static_cast<size_t>(vid)] != static_cast<int>(i) ||
              v.block_bytes != k.temp_bytes[t] || !k.may_write_over(static_cast<int>(o), t)) {
            continue;
          }
          s.reuse.emplace_back(static_cast<uint32_t>(t), static_cast<uint32_t>(o));
        }
      }
    }
    for (auto [m, b] : release[i]) {
      free[static_cast<size_t>(m)].emplace(
          p.planned[static_cast<size_t>(m)][static_cast<size_t>(b)], b);
    }
    // Planned blocks hold no Tensor to drop.
    std::erase_if(s.drop, [&](int v) { return p.values[static_cast<size_t>(v)].planned; });
  }
  for (JitValue& v : p.values) {
    v.first = p.flat;
    p.flat += static_cast<size_t>(v.npos);
  }
  for (JitStep& s : p.steps) {
    const size_t npos = s.in.empty() ? 0 : s.in.front().size();
    s.in_flat.assign(npos * s.in.size(), 0);
    for (size_t i = 0; i < s.in.size(); ++i) {
      for (size_t pos = 0; pos < npos; ++pos) {
        const Ref& r = s.in[i][pos];
        s.in_flat[pos * s.in.size() + i] = static_cast<uint32_t>(
            p.values[static_cast<size_t>(r.vid)].first + static_cast<size_t>(r.pos));
      }
    }
    for (int v : s.out) {
      s.out_first.push_back(static_cast<uint32_t>(p.values[static_cast<size_t>(v)].first));
    }
    if (s.kernels != nullptr) {
      for (size_t i = 0; i < s.in.size(); ++i) {
        bool fixed = true;
        for (const Ref& r : s.in[i]) fixed = fixed && p.values[static_cast<size_t>(r.vid)].planned;
        if (!fixed) s.dyn_operands.push_back(static_cast<uint32_t>(i));
      }
    }
  }
  p.places.resize(p.meshes.size());
  for (size_t m = 0; m < p.meshes.size(); ++m) {
    for (const Device& d : p.meshes[m].devices()) {
      p.places[m].push_back(JitPlace{d, is_local(d) ? &backend_of(d) : nullptr, d.local_index()});
    }
  }
}

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
  // Lines whose results only dropped steps made are printed as not replayed.
  std::vector<bool> made(p.values.size(), false);
  for (const JitStep& s : p.steps) {
    for (int v : s.out) made[static_cast<size_t>(v)] = true;
  }
  for (JitLine& l : p.lines) {
    if (l.out_vids.empty()) continue;
    l.replayed = std::any_of(l.out_vids.begin(), l.out_vids.end(), [&](int v) {
      const JitValue& jv = p.values[static_cast<size_t>(v)];
      return made[static_cast<size_t>(v)] || jv.input >= 0 || jv.constant;
    });
  }

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
  // A launch with a collective (or with large blocks, which eager ops compute on every device's
  // executor at once) runs as one task per device, all of its steps inside, so the executors are
  // woken once per launch. A launch of small device-local steps runs from the caller's thread,
  // device after device (as eager ops do, minus their planning): waking executors would cost
  // more than the work.
  // A psum the replay folds itself reads every position's block: a launch of its own, between the
  // steps before it (for every position) and after it.
  std::vector<JitSegment> split;
  for (const JitSegment& seg : p.segments) {
    size_t from = seg.begin;
    for (size_t i = seg.begin; i < seg.end; ++i) {
      if (!p.steps[i].host_psum) continue;
      if (from < i) split.push_back(JitSegment{from, i, seg.host, false, false});
      split.push_back(JitSegment{i, i + 1, false, false, true});
      from = i + 1;
    }
    if (from < seg.end) split.push_back(JitSegment{from, seg.end, seg.host, false, false});
  }
  p.segments = std::move(split);
  for (JitSegment& seg : p.segments) {
    if (seg.host || seg.fold) continue;
    seg.inline_run = true;
    for (size_t i = seg.begin; i < seg.end; ++i) {
      const JitStep& s = p.steps[i];
      if (s.kind != JitStep::local || s.concurrent) seg.inline_run = false;
    }
  }
  plan_psum_buckets(p);
  plan_buffers(p, last);
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

std::unique_ptr<JitArena> make_arena(const JitProgram& p) {
  auto a = std::make_unique<JitArena>();
  a->vals.resize(p.flat);
  a->ptrs.resize(p.flat);
  a->bufs.resize(p.meshes.size());
  for (size_t m = 0; m < p.meshes.size(); ++m) {
    const std::vector<Device>& devs = p.meshes[m].devices();
    a->bufs[m].resize(devs.size());
    for (size_t pos = 0; pos < devs.size(); ++pos) {
      if (!is_local(devs[pos])) continue;
      backend::Backend& be = backend_of(devs[pos]);
      for (size_t bytes : p.planned[m]) {
        a->bufs[m][pos].push_back(be.allocate(devs[pos].local_index(), bytes));
      }
    }
  }
  // Planned blocks stay where the plan put them: their addresses are set once.
  std::vector<int> maker_mesh(p.values.size(), -1);
  for (const JitStep& s : p.steps) {
    for (int v : s.out) maker_mesh[static_cast<size_t>(v)] = s.mesh_index;
  }
  for (size_t v = 0; v < p.values.size(); ++v) {
    const JitValue& jv = p.values[v];
    if (!jv.planned) continue;
    const auto& bufs = a->bufs[static_cast<size_t>(maker_mesh[v])];
    for (size_t pos = 0; pos < static_cast<size_t>(jv.npos); ++pos) {
      if (bufs[pos].empty()) continue;  // another process's position
      a->ptrs[jv.first + pos] =
          static_cast<char*>(bufs[pos][static_cast<size_t>(jv.home)]->data()) + jv.home_at;
    }
  }
  a->scratch.resize(p.steps.size());
  a->base.resize(p.steps.size());
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const JitStep& s = p.steps[i];
    if (s.kernels == nullptr) continue;
    const KernelProgram& k = *s.kernels;
    const std::vector<Device>& devs = s.mesh->devices();
    a->scratch[i].resize(devs.size());
    a->base[i].resize(devs.size());
    for (size_t pos = 0; pos < devs.size(); ++pos) {
      if (!is_local(devs[pos])) continue;
      a->scratch[i][pos] = k.make_scratch();
      std::vector<char*>& base = a->base[i][pos];
      base.assign(static_cast<size_t>(k.operands) + k.temp_bytes.size(), nullptr);
      for (size_t o = 0; o < static_cast<size_t>(k.operands); ++o) {
        base[o] = a->ptrs[s.in_flat[pos * static_cast<size_t>(k.operands) + o]];
      }
      const auto& bufs = a->bufs[static_cast<size_t>(s.mesh_index)][pos];
      for (size_t t = 0; t < k.temp_bytes.size(); ++t) {
        if (s.temp_home[t] >= 0) {
          base[static_cast<size_t>(k.operands) + t] =
              static_cast<char*>(bufs[static_cast<size_t>(s.temp_home[t])]->data());
        }
      }
    }
  }
  return a;
}

// Takes a free arena of the program (or makes one) for one call and gives it back, emptied of
// the call's Tensors, when the call ends.
class ArenaLease {
 public:
  explicit ArenaLease(const JitProgram& p) : p_(p) {
    {
      std::lock_guard<std::mutex> lock(p.arenas_mu);
      if (!p.arenas.empty()) {
        a_ = std::move(p.arenas.back());
        p.arenas.pop_back();
      }
    }
    if (!a_) a_ = make_arena(p);
  }
  ArenaLease(const ArenaLease&) = delete;
  ArenaLease& operator=(const ArenaLease&) = delete;
  ~ArenaLease() {
    for (Tensor& t : a_->vals) {
      if (t.valid()) t = Tensor();
    }
    std::lock_guard<std::mutex> lock(p_.arenas_mu);
    p_.arenas.push_back(std::move(a_));
  }
  JitArena& operator*() const { return *a_; }

 private:
  const JitProgram& p_;
  std::unique_ptr<JitArena> a_;
};

size_t flat_of(const JitProgram& p, const Ref& r) {
  return p.values[static_cast<size_t>(r.vid)].first + static_cast<size_t>(r.pos);
}

void set_block(const JitProgram& p, JitArena& a, int vid, size_t pos, Tensor t) {
  const size_t f = p.values[static_cast<size_t>(vid)].first + pos;
  a.ptrs[f] = static_cast<char*>(t.data());
  a.vals[f] = std::move(t);
}

// A donated input's buffer for leaving temporary `t` of compiled step `s` at `pos` (see
// JitStep::reuse), or null: only when this call holds the block's only reference (a copy of the
// Array the caller kept elsewhere would otherwise change under it), and the block starts its
// buffer. A buffer an earlier temporary of the step took has a second reference (its fresh slot),
// so it is never taken twice.
std::shared_ptr<backend::Buffer> donated_buffer(const JitProgram& p, const JitStep& s,
                                                const JitArena& a, size_t pos, size_t t) {
  for (const auto& [temp, o] : s.reuse) {
    if (temp != t) continue;
    const Ref& r = s.in[o][pos];
    const JitValue& v = p.values[static_cast<size_t>(r.vid)];
    if (a.donated[static_cast<size_t>(v.input)] == 0) continue;
    const Tensor& x = a.vals[v.first + static_cast<size_t>(r.pos)];
    const std::shared_ptr<backend::Buffer>& b = x.buffer();
    if (!x.valid() || b == nullptr || b.use_count() != 1 || x.byte_offset() != 0 ||
        b->bytes() < s.kernels->temp_bytes[t]) {
      continue;
    }
    // use_count() is a relaxed load: order this step's writes after whatever the holders that
    // have let go (another thread's Tensor, dropped with a release decrement) did to the block.
    std::atomic_thread_fence(std::memory_order_acquire);
    return b;
  }
  return nullptr;
}

// A compiled step at one position: the recorded kernels on the blocks' addresses, results in
// planned buffers, or in buffers allocated now for those that leave the compiled steps.
void run_kernels(const JitProgram& p, size_t step, JitArena& a, size_t pos) {
  const JitStep& s = p.steps[step];
  const KernelProgram& k = *s.kernels;
  const JitPlace& place = p.places[static_cast<size_t>(s.mesh_index)][pos];
  backend::Backend& be = *place.backend;
  const int dev = place.local;
  // The slot addresses: planned ones were set when the arena was made; operands that are not
  // planned change per call, and temporaries holding results that leave get new buffers.
  char** base = a.base[step][pos].data();
  const uint32_t* in = s.in_flat.data() + pos * static_cast<size_t>(k.operands);
  for (uint32_t i : s.dyn_operands) base[i] = a.ptrs[in[i]];
  std::array<std::shared_ptr<backend::Buffer>, 2> fresh_small;
  std::vector<std::shared_ptr<backend::Buffer>> fresh_big(s.fresh > 2 ? s.fresh : 0);
  std::shared_ptr<backend::Buffer>* fresh = s.fresh > 2 ? fresh_big.data() : fresh_small.data();
  if (s.fresh != 0) {
    for (size_t t = 0; t < k.temp_bytes.size(); ++t) {
      const int home = s.temp_home[t];
      if (home >= 0) continue;
      std::shared_ptr<backend::Buffer>& b = fresh[static_cast<size_t>(-1 - home)];
      b = donated_buffer(p, s, a, pos, t);
      if (b == nullptr) b = be.allocate(dev, k.temp_bytes[t]);
      base[static_cast<size_t>(k.operands) + t] = static_cast<char*>(b->data());
    }
  }
  k.run(be, dev, base, a.scratch[step][pos]);
  if (s.fresh == 0) return;  // every result planned: its address is already known
  for (size_t r = 0; r < k.results.size(); ++r) {
    const KernelAddr& at = k.results[r];
    const int home = s.temp_home[static_cast<size_t>(at.slot - k.operands)];
    if (home >= 0) continue;
    const size_t f = s.out_first[r] + pos;
    a.ptrs[f] = base[at.slot] + at.offset;
    a.vals[f] = Tensor(fresh[static_cast<size_t>(-1 - home)], static_cast<size_t>(at.offset),
                       k.result_shapes[r], k.result_dtypes[r], place.device);
  }
}

// Lets go of the blocks at `pos` that step `s` read for the last time.
void drop_blocks(const JitProgram& p, const JitStep& s, JitArena& a, size_t pos) {
  for (int v : s.drop) {
    Tensor& t = a.vals[p.values[static_cast<size_t>(v)].first + pos];
    if (t.valid()) t = Tensor();
  }
}

void run_step_at(const JitProgram& p, size_t step, JitArena& a, size_t pos, Context* ctx) {
  const JitStep& s = p.steps[step];
  if (s.kernels != nullptr) {
    run_kernels(p, step, a, pos);
  } else {
    std::vector<Tensor> ins;
    ins.reserve(s.in.size());
    for (const auto& refs : s.in) ins.push_back(a.vals[flat_of(p, refs[pos])]);
    std::vector<Tensor> outs = s.kind == JitStep::local ? s.fn(ins) : s.body(*ctx, ins);
    for (size_t o = 0; o < s.out.size(); ++o) set_block(p, a, s.out[o], pos, std::move(outs[o]));
  }
  drop_blocks(p, s, a, pos);
}

// A bucket of psum steps [first, bucket_end) at one position: the blocks flattened and laid end
// to end, one psum, and each step's result a piece of it (reshaped, no copy).
void run_psum_bucket(const JitProgram& p, size_t first, JitArena& a, size_t pos, Context& ctx) {
  const size_t end = p.steps[first].bucket_end;
  std::vector<Tensor> flat;
  for (size_t i = first; i < end; ++i) {
    const Tensor& t = a.vals[flat_of(p, p.steps[i].in.front()[pos])];
    flat.push_back(reshape(t, {shape_size(t.shape())}));
  }
  const Tensor sum = ctx.psum(concatenate(flat, 0), AxisNames(p.steps[first].psum_axes));
  flat.clear();
  int64_t at = 0;
  for (size_t i = first; i < end; ++i) {
    const JitStep& s = p.steps[i];
    const int64_t n = shape_size(s.block_shape);
    set_block(p, a, s.out.front(), pos, reshape(slice(sum, {at}, {at + n}), s.block_shape));
    at += n;
    drop_blocks(p, s, a, pos);
  }
}

// A host_psum step: per group, the members' blocks folded in group order into the first member's
// new block (as the direct algorithm's small reduction does), copied to the others'.
void fold_psum(const JitProgram& p, size_t step, JitArena& a) {
  const JitStep& s = p.steps[step];
  const std::vector<Device>& devs = s.mesh->devices();
  backend::Backend& be = backend_of(devs.front());
  const int64_t n = shape_size(s.block_shape);
  const size_t bytes = static_cast<size_t>(n) * dtype_size(s.dtype);
  std::vector<const void*> srcs;
  for (const std::vector<int64_t>& members : s.groups) {
    srcs.clear();
    for (int64_t m : members) srcs.push_back(a.ptrs[flat_of(p, s.in[0][static_cast<size_t>(m)])]);
    const size_t first = static_cast<size_t>(members.front());
    Tensor sum = empty(s.block_shape, s.dtype, devs[first]);
    if (n != 0) {
      be.coll_fold(devs[first].local_index(), backend::FoldOp::sum, s.dtype, s.dtype, sum.data(),
                   srcs, n);
    }
    for (size_t j = 1; j < members.size(); ++j) {
      const size_t m = static_cast<size_t>(members[j]);
      Tensor copy = empty(s.block_shape, s.dtype, devs[m]);
      if (bytes != 0) {
        be.coll_copy_2d(devs[m].local_index(), copy.data(), bytes, sum.data(), bytes, bytes, 1);
      }
      set_block(p, a, s.out[0], m, std::move(copy));
    }
    set_block(p, a, s.out[0], first, std::move(sum));
  }
  for (size_t pos = 0; pos < devs.size(); ++pos) {
    for (int v : s.drop) a.vals[p.values[static_cast<size_t>(v)].first + pos] = Tensor();
  }
}

Array gather(const JitProgram& p, const std::vector<Ref>& refs, const JitArena& a,
             const Shape& shape, DType dtype, const Sharding& sharding,
             const std::vector<std::string>& pending) {
  std::vector<Tensor> blocks;
  blocks.reserve(refs.size());
  for (const Ref& r : refs) blocks.push_back(a.vals[flat_of(p, r)]);
  return Array(shape, dtype, sharding, std::move(blocks), pending);
}

}  // namespace

std::vector<Array> jit_replay(const JitProgram& p, std::vector<Array> inputs,
                              const std::vector<bool>& donated) {
  if (inputs.size() != p.input_vids.size()) {
    throw Error(
        cat("[jit] internal: ", inputs.size(), " inputs for a program of ", p.input_vids.size()));
  }
  ArenaLease lease(p);
  JitArena& a = *lease;
  a.donated.assign(inputs.size(), 0);
  for (size_t i = 0; i < inputs.size() && i < donated.size(); ++i) a.donated[i] = donated[i];
  for (size_t v = 0; v < p.values.size(); ++v) {
    const JitValue& jv = p.values[v];
    if (!jv.constant) continue;
    for (size_t pos = 0; pos < jv.blocks.size(); ++pos) {
      set_block(p, a, static_cast<int>(v), pos, jv.blocks[pos]);
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int vid = p.input_vids[i];
    const std::vector<Tensor>& src = inputs[i].blocks();
    if (src.size() != static_cast<size_t>(p.values[static_cast<size_t>(vid)].npos)) {
      throw Error(cat("[jit] internal: input ", i, " has ", src.size(), " blocks, the program ",
                      p.values[static_cast<size_t>(vid)].npos));
    }
    for (size_t pos = 0; pos < src.size(); ++pos) set_block(p, a, vid, pos, src[pos]);
  }
  inputs.clear();  // the program's copies are the only ones it keeps (donated buffers can go)

  for (const JitSegment& seg : p.segments) {
    if (seg.host) {
      const JitStep& s = p.steps[seg.begin];
      Array x = gather(p, s.in.front(), a, s.shape, s.dtype, *s.from, s.pending);
      Array y = device_put(x, *s.to);
      for (size_t pos = 0; pos < y.blocks().size(); ++pos) {
        set_block(p, a, s.out.front(), pos, y.blocks()[pos]);
      }
      continue;
    }
    const Mesh& mesh = *p.steps[seg.begin].mesh;
    const std::vector<Device>& devs = mesh.devices();
    if (seg.inline_run) {
      for (size_t pos = 0; pos < devs.size(); ++pos) {
        if (!is_local(devs[pos])) continue;
        for (size_t i = seg.begin; i < seg.end; ++i) run_step_at(p, i, a, pos, nullptr);
      }
      continue;
    }
    if (seg.fold) {
      fold_psum(p, seg.begin, a);
      continue;
    }
    ErasedBody body = [&](Context& ctx, const std::vector<Tensor>&) {
      const Device d = ctx.device();
      size_t pos = 0;
      while (pos < devs.size() && devs[pos] != d) ++pos;
      for (size_t i = seg.begin; i < seg.end; ++i) {
        if (p.steps[i].bucket_end > i) {
          run_psum_bucket(p, i, a, pos, ctx);
          i = p.steps[i].bucket_end - 1;
          continue;
        }
        run_step_at(p, i, a, pos, &ctx);
      }
      return std::vector<Tensor>{};
    };
    (void)run_bodies(mesh, body, {});
  }

  std::vector<Array> out;
  out.reserve(p.outputs.size());
  for (const JitOutput& o : p.outputs) {
    out.push_back(gather(p, o.refs, a, o.shape, o.dtype, *o.sharding, o.pending));
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

std::string jit_text(const JitProgram& p, const std::vector<bool>& donated) {
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
    s += l.replayed ? "\n" : "  (unused: not replayed)\n";
    for (const CollectiveLog::Entry& e : l.collectives) {
      s += cat("      ", e.collective, " ", e.from, " -> ", e.to, ", ", e.bytes_per_device,
               " bytes per device", e.note.empty() ? "" : " (" + e.note + ")", "\n");
    }
  }
  for (size_t i = 0; i < p.out_paths.size(); ++i) {
    s += cat("  out ", p.out_paths[i], " = ", line_ref(p, p.output_from[i]), ": ", p.out_avals[i],
             "\n");
  }
  size_t host = 0, device = 0, inline_runs = 0, folds = 0, collectives = 0;
  for (const JitSegment& seg : p.segments) {
    (seg.host ? host : seg.fold ? folds : seg.inline_run ? inline_runs : device) += 1;
  }
  size_t compiled = 0, kernels = 0, buffers = 0, buffer_bytes = 0;
  std::map<std::string, size_t> why_not;  // of device-local steps not compiled
  for (const JitStep& st : p.steps) {
    collectives += st.kind == JitStep::blocks ? 1 : 0;
    if (st.kernels != nullptr) {
      ++compiled;
      kernels += st.kernels->size();
    } else if (st.kind == JitStep::local) {
      ++why_not[st.why_not.empty() ? "not recorded" : st.why_not];
    }
  }
  for (const std::vector<size_t>& m : p.planned) {
    buffers += m.size();
    for (size_t b : m) buffer_bytes += b;
  }
  s += cat("  replay: ", p.steps.size(), " steps (", collectives, " with collectives) in ",
           p.segments.size(), " launches per call: ", device, " as one task per device, ",
           inline_runs, " on small blocks from the caller's thread, ", folds,
           " small psums folded from the caller's thread, ", host, " reshards from the caller\n");
  size_t buckets = 0, bucketed = 0;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    if (p.steps[i].bucket_end > i) {
      ++buckets;
      bucketed += p.steps[i].bucket_end - i;
    }
  }
  if (buckets != 0) {
    s += cat("  psum buckets: ", bucketed, " psums taken as ", buckets,
             " collective(s) over their blocks laid end to end\n");
  }
  s += cat("  compiled: ", compiled, " device-local steps as ", kernels,
           " kernel calls; intermediates in ", buffers, " planned buffers per device (",
           buffer_bytes, " bytes), reused by every call\n");
  // Only what a call with these donations can do: a step counts when one of the operands whose
  // buffer it may take is a donated input.
  size_t in_place = 0;
  for (const JitStep& st : p.steps) {
    in_place += std::any_of(st.reuse.begin(), st.reuse.end(), [&](const auto& r) {
      const int input = p.values[static_cast<size_t>(st.in[r.second].front().vid)].input;
      return input >= 0 && static_cast<size_t>(input) < donated.size() &&
             donated[static_cast<size_t>(input)];
    });
  }
  if (in_place != 0) {
    s += cat("  in place: ", in_place,
             in_place == 1 ? " compiled step writes" : " compiled steps write",
             " results into the buffers of donated inputs read there last\n");
  }
  for (const auto& [why, n] : why_not) {
    s += cat("  not compiled: ", n, n == 1 ? " step" : " steps", " (", why, ")\n");
  }
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
  if (const Mesh* m = sh.mesh_or_null()) {
    for (int64_t d : m->shape()) put_int(s, d);
    put_names(s, m->axis_names());
    for (const PartitionSpec::Entry& e : sh.spec_or_empty().entries()) put_names(s, e);
  }
  s += '+';
  put_names(s, x.pending_sum_axes());
  return s;
}

}  // namespace meshrt::detail
