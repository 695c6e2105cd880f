// jit's replay: the planned steps run on new inputs, launch by launch, in a reused arena.
#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/strings.h"
#include "global/jit_ir.h"
#include "global/jit_program.h"
#include "global/jit_shard_map.h"
#include "runtime/detail/access.h"
#include "runtime/detail/launch.h"
#include "runtime/detail/op_apply.h"
#include "runtime/detail/platform.h"
#include "runtime/tensor_ops.h"

namespace meshrt::detail {

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
    const LocalStep* l = s.local();
    if (l == nullptr || l->kernels == nullptr) continue;
    const KernelProgram& k = *l->kernels;
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
        if (l->temp_home[t] >= 0) {
          base[static_cast<size_t>(k.operands) + t] =
              static_cast<char*>(bufs[static_cast<size_t>(l->temp_home[t])]->data());
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

// A donated input's buffer for leaving temporary `t` of compiled step `s` (`l`: its kernels) at
// `pos` (see LocalStep::reuse), or null: only when this call holds the block's only reference (a
// copy of the Array the caller kept elsewhere would otherwise change under it), and the block
// starts its buffer. A buffer an earlier temporary of the step took has a second reference (its
// fresh slot), so it is never taken twice.
std::shared_ptr<backend::Buffer> donated_buffer(const JitProgram& p, const JitStep& s,
                                                const LocalStep& l, const JitArena& a, size_t pos,
                                                size_t t) {
  for (const auto& [temp, o] : l.reuse) {
    if (temp != t) continue;
    const Ref& r = s.in[o][pos];
    const JitValue& v = p.values[static_cast<size_t>(r.vid)];
    if (a.donated[static_cast<size_t>(v.input)] == 0) continue;
    const Tensor& x = a.vals[v.first + static_cast<size_t>(r.pos)];
    const std::shared_ptr<backend::Buffer>& b = TensorAccess::buffer(x);
    if (!x.valid() || b == nullptr || b.use_count() != 1 || TensorAccess::byte_offset(x) != 0 ||
        b->bytes() < l.kernels->temp_bytes[t]) {
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
void run_kernels(const JitProgram& p, size_t step, const LocalStep& l, JitArena& a, size_t pos) {
  const JitStep& s = p.steps[step];
  const KernelProgram& k = *l.kernels;
  const JitPlace& place = p.places[static_cast<size_t>(s.mesh_index)][pos];
  backend::Backend& be = *place.backend;
  const int dev = place.local;
  // The slot addresses: planned ones were set when the arena was made; operands that are not
  // planned change per call, and temporaries holding results that leave get new buffers.
  char** base = a.base[step][pos].data();
  const uint32_t* in = s.in_flat.data() + pos * static_cast<size_t>(k.operands);
  for (uint32_t i : l.dyn_operands) base[i] = a.ptrs[in[i]];
  std::array<std::shared_ptr<backend::Buffer>, 2> fresh_small;
  std::vector<std::shared_ptr<backend::Buffer>> fresh_big(l.fresh > 2 ? l.fresh : 0);
  std::shared_ptr<backend::Buffer>* fresh = l.fresh > 2 ? fresh_big.data() : fresh_small.data();
  if (l.fresh != 0) {
    for (size_t t = 0; t < k.temp_bytes.size(); ++t) {
      const int home = l.temp_home[t];
      if (home >= 0) continue;
      std::shared_ptr<backend::Buffer>& b = fresh[static_cast<size_t>(-1 - home)];
      b = donated_buffer(p, s, l, a, pos, t);
      if (b == nullptr) b = be.allocate(dev, k.temp_bytes[t]);
      base[static_cast<size_t>(k.operands) + t] = static_cast<char*>(b->data());
    }
  }
  k.run_as_graph(be, dev, base, a.scratch[step][pos]);
  if (l.fresh == 0) return;  // every result planned: its address is already known
  for (size_t r = 0; r < k.results.size(); ++r) {
    const KernelAddr& at = k.results[r];
    const int home = l.temp_home[static_cast<size_t>(at.slot - k.operands)];
    if (home >= 0) continue;
    const size_t f = s.out_first[r] + pos;
    a.ptrs[f] = base[at.slot] + at.offset;
    a.vals[f] =
        TensorAccess::make(fresh[static_cast<size_t>(-1 - home)], static_cast<size_t>(at.offset),
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

// A local or blocks step at one position (`ctx`: the position's context, for a blocks step).
void run_step_at(const JitProgram& p, size_t step, JitArena& a, size_t pos, Context* ctx) {
  const JitStep& s = p.steps[step];
  const LocalStep* l = s.local();
  if (l != nullptr && l->kernels != nullptr) {
    run_kernels(p, step, *l, a, pos);
  } else {
    std::vector<Tensor> ins;
    ins.reserve(s.in.size());
    for (const auto& refs : s.in) ins.push_back(a.vals[flat_of(p, refs[pos])]);
    std::vector<Tensor> outs = l != nullptr ? l->fn(ins) : s.blocks()->body(*ctx, ins);
    for (size_t o = 0; o < s.out.size(); ++o) set_block(p, a, s.out[o], pos, std::move(outs[o]));
  }
  drop_blocks(p, s, a, pos);
}

// A bucket of psum steps [first, bucket_end) at one position: the blocks flattened and laid end
// to end, one psum, and each step's result a piece of it (reshaped, no copy).
void run_psum_bucket(const JitProgram& p, size_t first, JitArena& a, size_t pos, Context& ctx) {
  const BlocksStep& head = *p.steps[first].blocks();
  const size_t end = head.bucket_end;
  std::vector<Tensor> flat;
  for (size_t i = first; i < end; ++i) {
    const Tensor& t = a.vals[flat_of(p, p.steps[i].in.front()[pos])];
    flat.push_back(reshape(t, {shape_size(t.shape())}));
  }
  const Tensor sum = ctx.psum(concatenate(flat, 0), AxisNames(head.psum_axes));
  flat.clear();
  int64_t at = 0;
  for (size_t i = first; i < end; ++i) {
    const JitStep& s = p.steps[i];
    const Shape& block_shape = s.blocks()->block_shape;
    const int64_t n = shape_size(block_shape);
    set_block(p, a, s.out.front(), pos, reshape(slice(sum, {at}, {at + n}), block_shape));
    at += n;
    drop_blocks(p, s, a, pos);
  }
}

// A host_psum step: per group, the members' blocks folded in group order into the first member's
// new block (as the direct algorithm's small reduction does), copied to the others'.
void fold_psum(const JitProgram& p, size_t step, JitArena& a) {
  const JitStep& s = p.steps[step];
  const BlocksStep& b = *s.blocks();
  const std::vector<Device>& devs = s.mesh->devices();
  backend::Backend& be = backend_of(devs.front());
  const int64_t n = shape_size(b.block_shape);
  const size_t bytes = static_cast<size_t>(n) * dtype_size(b.dtype);
  std::vector<const void*> srcs;
  for (const std::vector<int64_t>& members : b.groups) {
    srcs.clear();
    for (int64_t m : members) srcs.push_back(a.ptrs[flat_of(p, s.in[0][static_cast<size_t>(m)])]);
    const size_t first = static_cast<size_t>(members.front());
    Tensor sum = empty(b.block_shape, b.dtype, devs[first]);
    if (n != 0) {
      be.coll_fold(devs[first].local_index(), backend::FoldOp::sum, b.dtype, b.dtype, sum.data(),
                   srcs, n);
    }
    for (size_t j = 1; j < members.size(); ++j) {
      const size_t m = static_cast<size_t>(members[j]);
      Tensor copy = empty(b.block_shape, b.dtype, devs[m]);
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

// A compiled run of a body's ops at one position (BodySegment): its kernels on the operands'
// blocks, into buffers allocated now (Tensors of the body, as the ops would have made), then the
// values its ops read for the last time let go.
void run_segment(const JitPlace& place, const BodyProgram& b, const BodySegment& seg,
                 std::vector<Tensor>& v) {
  const KernelProgram& k = *seg.kernels;
  backend::Backend& be = *place.backend;
  std::vector<char*> base(static_cast<size_t>(k.operands) + k.temp_bytes.size());
  for (size_t o = 0; o < seg.operands.size(); ++o) {
    base[o] = static_cast<char*>(v[static_cast<size_t>(seg.operands[o])].data());
  }
  std::vector<std::shared_ptr<backend::Buffer>> temps;
  temps.reserve(k.temp_bytes.size());
  for (size_t t = 0; t < k.temp_bytes.size(); ++t) {
    temps.push_back(be.allocate(place.local, k.temp_bytes[t]));
    base[static_cast<size_t>(k.operands) + t] = static_cast<char*>(temps.back()->data());
  }
  std::vector<backend::Strided> scratch = k.make_scratch();
  k.run(be, place.local, base.data(), scratch);
  for (size_t r = 0; r < k.results.size(); ++r) {
    const KernelAddr& a = k.results[r];
    v[static_cast<size_t>(seg.results[r])] = TensorAccess::make(
        temps[static_cast<size_t>(a.slot - k.operands)], static_cast<size_t>(a.offset),
        k.result_shapes[r], k.result_dtypes[r], place.device);
  }
  for (size_t i = seg.begin; i < seg.end; ++i) {
    for (int x : b.ops[i].last) v[static_cast<size_t>(x)] = Tensor();
  }
}

// A shard_map step (ShardMapStep): every position's recorded body run again on its device,
// through the same Tensor ops and collectives (apply_op), the results assembled as the eager
// shard_map assembles them (the replication check included), the blocks later shard_map steps
// read set per position; then the blocks read here for the last time let go.
void run_shard_map_step(const JitProgram& p, size_t step, JitArena& a) {
  const JitStep& s = p.steps[step];
  const ShardMapStep& sm = *s.shard_map();
  const Mesh& mesh = *s.mesh;
  const std::vector<Device>& devs = mesh.devices();
  ErasedBody body = [&](Context& ctx, const std::vector<Tensor>&) {
    const auto pos =
        static_cast<size_t>(std::find(devs.begin(), devs.end(), ctx.device()) - devs.begin());
    const BodyProgram& b = sm.bodies[pos];
    std::vector<Tensor> v(b.meta.size());
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      if (b.inputs[i] >= 0) v[static_cast<size_t>(b.inputs[i])] = a.vals[flat_of(p, s.in[i][pos])];
    }
    for (const auto& [id, t] : b.constants) v[static_cast<size_t>(id)] = t;
    size_t at = 0;  // the next op
    for (const BodySegment& seg : sm.segments) {
      run_body_ops(b, at, seg.begin, v, &ctx);
      run_segment(p.places[static_cast<size_t>(s.mesh_index)][pos], b, seg, v);
      at = seg.end;
    }
    run_body_ops(b, at, b.ops.size(), v, &ctx);
    std::vector<Tensor> out;
    out.reserve(b.results.size());
    for (int x : b.results) out.push_back(x >= 0 ? v[static_cast<size_t>(x)] : Tensor());
    return out;
  };
  std::vector<std::vector<Tensor>> outs = run_bodies(mesh, body, {});
  const size_t n = sm.out_specs.size();
  for (size_t pos = 0; pos < devs.size(); ++pos) {
    for (size_t e = n; e < outs[pos].size(); ++e) {
      set_block(p, a, s.out[e], pos, std::move(outs[pos][e]));
    }
    if (outs[pos].size() > n) outs[pos].resize(n);
  }
  std::vector<Array> arrays = assemble_outputs(mesh, sm.out_specs, std::move(outs), sm.options);
  for (size_t k = 0; k < arrays.size(); ++k) {
    const std::vector<Tensor>& blocks = ArrayAccess::blocks(arrays[k]);
    for (size_t pos = 0; pos < blocks.size(); ++pos) set_block(p, a, s.out[k], pos, blocks[pos]);
  }
  for (size_t pos = 0; pos < devs.size(); ++pos) drop_blocks(p, s, a, pos);
}

Array gather(const JitProgram& p, const std::vector<Ref>& refs, const JitArena& a,
             const Shape& shape, DType dtype, const Sharding& sharding,
             const std::vector<std::string>& pending) {
  std::vector<Tensor> blocks;
  blocks.reserve(refs.size());
  for (const Ref& r : refs) blocks.push_back(a.vals[flat_of(p, r)]);
  return ArrayAccess::make(shape, dtype, sharding, std::move(blocks), pending);
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
    const std::vector<Tensor>& src = ArrayAccess::blocks(inputs[i]);
    if (src.size() != static_cast<size_t>(p.values[static_cast<size_t>(vid)].npos)) {
      throw Error(cat("[jit] internal: input ", i, " has ", src.size(), " blocks, the program ",
                      p.values[static_cast<size_t>(vid)].npos));
    }
    for (size_t pos = 0; pos < src.size(); ++pos) set_block(p, a, vid, pos, src[pos]);
  }
  inputs.clear();  // the program's copies are the only ones it keeps (donated buffers can go)

  for (const JitLaunch& launch : p.launches) {
    switch (launch.kind) {
      case JitLaunch::Kind::reshard: {
        const JitStep& s = p.steps[launch.begin];
        const ReshardStep& r = *s.reshard();
        Array x = gather(p, s.in.front(), a, r.shape, r.dtype, r.from, r.pending);
        Array y = device_put(x, r.to);
        for (size_t pos = 0; pos < ArrayAccess::blocks(y).size(); ++pos) {
          set_block(p, a, s.out.front(), pos, ArrayAccess::blocks(y)[pos]);
        }
        break;
      }
      case JitLaunch::Kind::fold:
        fold_psum(p, launch.begin, a);
        break;
      case JitLaunch::Kind::shard_map:
        run_shard_map_step(p, launch.begin, a);
        break;
      case JitLaunch::Kind::inline_run: {
        const std::vector<Device>& devs = p.steps[launch.begin].mesh->devices();
        for (size_t pos = 0; pos < devs.size(); ++pos) {
          if (!is_local(devs[pos])) continue;
          for (size_t i = launch.begin; i < launch.end; ++i) run_step_at(p, i, a, pos, nullptr);
        }
        break;
      }
      case JitLaunch::Kind::tasks: {
        const Mesh& mesh = *p.steps[launch.begin].mesh;
        const std::vector<Device>& devs = mesh.devices();
        ErasedBody body = [&](Context& ctx, const std::vector<Tensor>&) {
          const Device d = ctx.device();
          size_t pos = 0;
          while (pos < devs.size() && devs[pos] != d) ++pos;
          for (size_t i = launch.begin; i < launch.end; ++i) {
            const BlocksStep* b = p.steps[i].blocks();
            if (b != nullptr && b->bucket_end > i) {
              run_psum_bucket(p, i, a, pos, ctx);
              i = b->bucket_end - 1;
              continue;
            }
            run_step_at(p, i, a, pos, &ctx);
          }
          return std::vector<Tensor>{};
        };
        (void)run_bodies(mesh, body, {});
        break;
      }
    }
  }

  std::vector<Array> out;
  out.reserve(p.outputs.size());
  for (const JitOutput& o : p.outputs) {
    out.push_back(gather(p, o.refs, a, o.shape, o.dtype, *o.sharding, o.pending));
  }
  return out;
}

}  // namespace meshrt::detail
