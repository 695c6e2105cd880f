// global/jit_ir.h: jit's program, as the recorder writes it, the plan annotates it and the replay
// and the printer read it (not installed; the public entry points are global/jit_program.h).
//
// A value is a set of blocks, one per mesh position, named by its index into `values` (its id);
// a step (one of four kinds: LocalStep, BlocksStep, ReshardStep, ShardMapStep) reads values' blocks
// by id and position (`Ref`) and makes new values; a launch runs consecutive steps together. One
// file per pass: global/jit_record.cpp (the trace: steps and lines), global/jit_plan.cpp (unused
// steps removed, last uses, launches, psum buckets), global/jit_fuse.cpp (fused steps),
// global/jit_buffers.cpp (which values live in planned buffers, and the buffers),
// global/jit_replay.cpp (running the steps on new inputs), global/jit_print.cpp (as_text,
// as_dot).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "backends/backend.h"
#include "global/collective_log.h"
#include "global/launch.h"
#include "global/layout.h"
#include "runtime/array.h"
#include "runtime/detail/kernel_tape.h"
#include "runtime/detail/op_apply.h"
#include "runtime/detail/op_registry.h"
#include "runtime/mesh.h"
#include "runtime/partition_spec.h"
#include "runtime/shard_map.h"
#include "runtime/sharding.h"

namespace meshrt::detail {

// One device's block of a value: value id and mesh position.
struct Ref {
  int vid = -1;
  int pos = 0;
  bool operator==(const Ref&) const = default;
};

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

// A device-local step: run_local's launch, `fn` on each position's blocks.
struct LocalStep {
  global::LocalFn fn;
  bool concurrent = false;  // large blocks, computed on every device's executor at once
  // The kernels fn calls, recorded at trace time (null: fn itself runs; why_not says why).
  std::shared_ptr<const KernelProgram> kernels;
  std::string why_not;
  // Per temporary of `kernels`: its planned buffer (an index into the mesh's buffers), or -1 - j
  // when it holds a result that leaves the compiled steps (the j-th of `fresh` buffers allocated
  // per call, since a Tensor keeps it).
  std::vector<int> temp_home;
  size_t fresh = 0;
  // (temporary, operand): a temporary that leaves may take the operand's buffer instead of a new
  // one, when the operand is a donated input read here for the last time, this call holds its
  // only reference, and the kernels allow it (KernelProgram::may_write_over): in-place donation.
  std::vector<std::pair<uint32_t, uint32_t>> reuse;
  std::vector<uint32_t> dyn_operands;  // compiled: operands whose address changes per call
};

// A step with collectives: run_blocks's launch, `body` on every position's blocks.
struct BlocksStep {
  global::Body body;
  // A psum of the operand over mesh axes that the replay folds from the caller's thread (host
  // memory, every device in this process, small blocks): the direct algorithm's fold, in the
  // same member order, so the same bits, without waking the executors.
  bool host_psum = false;
  std::vector<std::vector<int64_t>> groups;  // host_psum: per group, its members' positions
  Shape block_shape;                         // host_psum, psum_axes: of every block
  DType dtype = DType::f32;                  // host_psum, psum_axes: of every block
  // The body is exactly a psum of its one operand over these axes (a pending sum resolved),
  // blocks of block_shape and dtype; empty otherwise.
  global::AxisList psum_axes;
  // Device platforms: steps [this one, bucket_end) are psums over the same axes that the replay
  // takes as one collective over their blocks laid end to end (plan_psum_buckets).
  size_t bucket_end = 0;
};

// A reshard run from the caller's thread: device_put of the operand (an Array of this shape,
// dtype, sharding and pending sums) onto `to`.
struct ReshardStep {
  Shape shape;
  DType dtype = DType::f32;
  Sharding from, to;
  std::vector<std::string> pending;
};

// One op a shard_map body ran on one device, as its tracer saw it: replayed with apply_op.
struct BodyOp {
  OpId op = OpId::identity;
  OpAttrs attrs;
  std::vector<int> in, out;  // the body's values
  std::vector<int> last;     // values read here for the last time (plan_body_frees)
};

// What a shard_map body did on one mesh position, as ops on values (indices into `meta`): its
// operands, the constants it read (Tensors made outside the body or by what a tracer does not
// see: zeros, random numbers from a key, a block captured by the body), and its ops' results.
struct BodyProgram {
  std::vector<int> inputs;                        // per operand of the step: its value, or -1
  std::vector<std::pair<int, Tensor>> constants;  // (value, its Tensor)
  std::vector<ResultMeta> meta;                   // per value
  std::vector<BodyOp> ops;                        // in order
  std::vector<int> results;                       // per result of the step: its value
  // Whether another position's program has the same ops on the same values (then a value of one
  // position is the same value at every position); `attrs`: with the same attributes too (then
  // one position's compiled runs serve every position).
  bool same_as(const BodyProgram& o, bool attrs = false) const;
};

// A run of a shard_map body's ops without collectives, compiled by the kernel tape (the same ops
// at every position): replayed as its recorded kernels instead of op by op.
struct BodySegment {
  size_t begin = 0, end = 0;  // ops [begin, end) of every position's body
  std::vector<int> operands;  // values it reads that were made before it (kernel operands)
  std::vector<int> results;   // values it makes that are read after it or are results
  std::shared_ptr<const KernelProgram> kernels;
};

// A shard_map inside the jitted function: its placement is recorded as reshard steps before it,
// its bodies as ops per position (BodyProgram), replayed by running those ops on every device
// (run_bodies) and assembling the results as the eager shard_map does, replication check
// included. Operands: the `args` placed arguments, then blocks of earlier shard_map steps that
// the bodies read (what autodiff's transpose body reads of the forward body's values). Results:
// one Array per out_spec, then such blocks that later shard_map steps read (one value each).
struct ShardMapStep {
  std::vector<BodyProgram> bodies;  // per mesh position (another process's: empty)
  std::vector<PartitionSpec> out_specs;
  ShardMapOptions options;
  size_t args = 0;
  // Per extra result: its body value, the same at every position, or -1 where the bodies differ
  // (then each position's BodyProgram::results say, -1 at positions that give no block).
  std::vector<int> exported;
  // Compiled runs of ops, in op order (compile_body_segments); empty: every op runs as a Tensor
  // op. Shared by the positions, whose programs are then the same.
  std::vector<BodySegment> segments;
};

// One launch of the trace, replayed: what it ran (`op`, one of the four kinds) and the values
// it read and made.
struct JitStep {
  std::variant<LocalStep, BlocksStep, ReshardStep, ShardMapStep> op;
  std::optional<Mesh> mesh;  // of a local or blocks step (a reshard moves between meshes: none)
  int mesh_index = -1;       // the same, as an index into JitProgram::meshes
  std::vector<std::vector<Ref>> in;  // per operand, per position
  std::vector<int> out;              // value ids
  std::vector<int> drop;  // values whose blocks at the running position are not read again
  // Flat table indices (JitValue::first + position), computed once: in_flat[pos * operands + i]
  // is operand i's block at pos; out_first[o] is result o's first block.
  std::vector<uint32_t> in_flat;
  std::vector<uint32_t> out_first;

  // The step's kind, or null when it is of another kind.
  LocalStep* local() { return std::get_if<LocalStep>(&op); }
  const LocalStep* local() const { return std::get_if<LocalStep>(&op); }
  BlocksStep* blocks() { return std::get_if<BlocksStep>(&op); }
  const BlocksStep* blocks() const { return std::get_if<BlocksStep>(&op); }
  const ReshardStep* reshard() const { return std::get_if<ReshardStep>(&op); }
  ShardMapStep* shard_map() { return std::get_if<ShardMapStep>(&op); }
  const ShardMapStep* shard_map() const { return std::get_if<ShardMapStep>(&op); }
  // A compiled local step's kernels, else null.
  const KernelProgram* kernels() const {
    const LocalStep* l = local();
    return l != nullptr ? l->kernels.get() : nullptr;
  }
  // A psum the replay folds from the caller's thread (BlocksStep::host_psum).
  bool host_psum() const {
    const BlocksStep* b = blocks();
    return b != nullptr && b->host_psum;
  }
};

// Consecutive steps the replay runs together, and how.
struct JitLaunch {
  enum class Kind {
    tasks,       // one task per device of the steps' mesh, every step inside
    inline_run,  // every device's steps from the caller's thread (small blocks, no collectives)
    fold,        // one host_psum step, folded from the caller's thread
    reshard,     // one reshard, run from the caller's thread
    shard_map,   // one shard_map step: its bodies on every device, assembled from the caller
  };
  size_t begin = 0, end = 0;  // steps [begin, end)
  Kind kind = Kind::tasks;
};

struct JitLine {
  std::string op;
  std::vector<std::string> ins, outs;
  std::vector<int> in_from;  // per operand: producing line, -1 - k for input k, kConst
  std::vector<CollectiveLog::Entry> collectives;
  std::vector<int> out_vids;       // its results' values, where a step made them
  bool replayed = true;            // false when plan() dropped every step making its results
  std::vector<std::string> notes;  // printed under the line (a shard_map body's collectives)
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
  std::vector<JitLaunch> launches;
  std::vector<JitLine> lines;
};

// The plan (global/jit_plan.cpp): drops steps whose results are never used, plans when blocks can
// be dropped, groups the steps into launches and psum buckets, then plans the buffers. Called once,
// when the trace ends.
void jit_plan(JitProgram& p);

// The fusion pass (global/jit_fuse.cpp), part of the plan: consecutive compiled device-local steps
// linked by a value only the second reads, merged into one step where their kernels hold an
// elementwise pair to fuse (fuse_elementwise_pairs) and the platform has fused kernels. Returns
// the number of steps merged.
int jit_fuse_steps(JitProgram& p);

// The buffer pass (global/jit_buffers.cpp): which values live in planned buffers, and the buffers;
// with the replay's flat tables and the meshes' places. `last`: each value's last reading step,
// or -1.
void jit_plan_buffers(JitProgram& p, const std::vector<int>& last);

}  // namespace meshrt::detail
