// shard_map's transpose: a differentiated shard_map is one node whose pullback is a shard_map
// running each body's tape backward.
#include <memory>

#include "autodiff/tape.h"
#include "core/error.h"
#include "core/strings.h"
#include "global/array_ops.h"
#include "runtime/detail/access.h"
#include "runtime/detail/spec_error.h"
#include "runtime/shard_map.h"

namespace meshrt::autodiff {

using detail::cat;

// ---- shard_map: one node whose pullback is a shard_map running each body's tape backward.
namespace {

// What one device's body recorded.
struct BodyRecord {
  std::unique_ptr<Tape> tape;
  std::vector<uint64_t> in_ids;  // watched inputs (0: not differentiated)
  std::vector<Meta<Tensor>> in_meta;
  std::vector<uint64_t> out_ids;
  std::vector<AxisSet> out_vma;
};

AxisSet spec_axes(const Mesh& mesh, const PartitionSpec& spec) {
  return unite(mesh, {}, spec.axes());
}

size_t flat_position(Context& ctx) {
  return static_cast<size_t>(ctx.axis_index(AxisNames(ctx.mesh().axis_names())));
}

}  // namespace

std::optional<std::vector<Array>> Tape::shard_map(detail::RunShardMap run,
                                                  const detail::ErasedBody& body, const Mesh& mesh,
                                                  const std::vector<PartitionSpec>& in_specs,
                                                  const std::vector<PartitionSpec>& out_specs,
                                                  const std::vector<Array>& args,
                                                  const ShardMapOptions& options) {
  if (body_mesh_) return std::nullopt;
  std::vector<bool> diff(args.size());
  bool any = false;
  for (size_t i = 0; i < args.size(); ++i) {
    diff[i] = follows(detail::trace_id(args[i])) && is_floating(args[i].dtype());
    any = any || diff[i];
  }
  if (!any) return std::nullopt;

  auto records = std::make_shared<std::vector<BodyRecord>>(static_cast<size_t>(mesh.size()));
  for (BodyRecord& r : *records) r.tape = std::make_unique<Tape>(mesh);
  std::vector<AxisSet> in_vma, out_axes;
  for (const PartitionSpec& s : in_specs) in_vma.push_back(spec_axes(mesh, s));
  for (const PartitionSpec& s : out_specs) out_axes.push_back(spec_axes(mesh, s));

  detail::ErasedBody traced = [&](Context& ctx, const std::vector<Tensor>& xs) {
    BodyRecord& r = (*records)[flat_position(ctx)];
    detail::TraceScope on(*r.tape);
    std::vector<Tensor> ins = xs;
    for (size_t i = 0; i < ins.size(); ++i) {
      if (diff[i]) {
        r.tape->watch(ins[i], cat("shard_map input ", i), in_vma[i]);
        r.in_ids.push_back(detail::trace_id(ins[i]));
      } else {
        r.tape->note_vma(ins[i], in_vma[i]);
        r.in_ids.push_back(0);
      }
      r.in_meta.push_back(Meta<Tensor>::of(ins[i]));
    }
    std::vector<Tensor> outs = body(ctx, ins);
    for (size_t k = 0; k < outs.size(); ++k) {
      const uint64_t id = detail::trace_id(outs[k]);
      r.out_ids.push_back(id);
      r.out_vma.push_back(r.tape->vma_of(id));
      const AxisSet varying =
          k < out_axes.size() ? minus(r.out_vma.back(), out_axes[k]) : AxisSet{};
      if (r.tape->follows(id) && !varying.empty()) {
        throw detail::SpecError(
            detail::SpecList::out, k,
            cat("[shard_map] out_specs[", k, "] is ", out_specs[k].str(),
                " which implies that the corresponding output value is replicated across "
                "mesh axis ",
                detail::quote(varying.front()),
                ", but could not infer replication over it: the value varies over it (it "
                "comes from an input or collective that does, e.g. all_gather), and its "
                "gradient would count every copy (JAX's check_vma rejects it too). psum or "
                "pmean over the axis, or name it in out_specs"));
      }
    }
    return outs;
  };
  std::vector<Array> outs;
  {
    detail::Untraced off;
    outs = run(traced, mesh, in_specs, out_specs, args, options);
  }

  Node<Array> n;
  n.op = detail::OpId::shard_map;
  for (size_t i = 0; i < args.size(); ++i) {
    n.in.push_back(diff[i] ? detail::trace_id(args[i]) : 0);
    n.in_meta.push_back(Meta<Array>::of(args[i]));
  }
  follow_outputs(n, std::span<Array>(outs), known_);
  ShardMapOptions back = options;
  back.name = options.name.empty() ? "transpose" : cat("transpose(", options.name, ")");
  n.pullback = [records, mesh, in_specs, out_specs, back, out_axes, diff,
                out_meta = n.out_meta](const CtList<Array>& cts) -> CtList<Array> {
    std::vector<Array> ct_args;
    for (size_t k = 0; k < cts.size(); ++k) {
      ct_args.push_back(
          cts[k] ? *cts[k]
                 : zeros(out_meta[k].shape, out_meta[k].dtype, NamedSharding(mesh, out_specs[k])));
    }
    detail::ErasedBody transpose = [records, out_axes](Context& ctx,
                                                       const std::vector<Tensor>& gs) {
      BodyRecord& r = (*records)[flat_position(ctx)];
      std::vector<std::pair<uint64_t, Tensor>> seeds;
      for (size_t k = 0; k < gs.size(); ++k) {
        Tensor g = gs[k];
        // An output that does not vary over an axis its out_spec splits was broadcast there.
        const AxisSet missing = minus(out_axes[k], r.out_vma[k]);
        if (!missing.empty()) g = ctx.psum(g, AxisNames(missing));
        seeds.emplace_back(r.out_ids[k], g);
      }
      Env env{&ctx};
      r.tape->backward(std::move(seeds), {}, env);
      std::vector<Tensor> in_cts;
      for (size_t i = 0; i < r.in_ids.size(); ++i) {
        std::optional<Tensor> g;
        if (r.in_ids[i] != 0) g = r.tape->tensor_grad(r.in_ids[i]);
        in_cts.push_back(g ? fit(*g, r.in_meta[i]) : zeros_of(r.in_meta[i]));
      }
      r.tape.reset();  // this device's record is used and freed
      return in_cts;
    };
    std::vector<Array> in_cts =
        detail::run_shard_map(transpose, mesh, out_specs, in_specs, ct_args, back);
    CtList<Array> out;
    for (size_t i = 0; i < in_cts.size(); ++i) {
      if (diff[i])
        out.emplace_back(std::move(in_cts[i]));
      else
        out.emplace_back(std::nullopt);
    }
    return out;
  };
  nodes_.emplace_back(std::move(n));
  return outs;
}

}  // namespace meshrt::autodiff
