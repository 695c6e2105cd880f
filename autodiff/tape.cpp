// The tape: recording, the backward pass, shard_map's transpose, and the public entry points'
// recording (autodiff.h).
#include "autodiff/tape.h"

#include <algorithm>
#include <type_traits>

#include "autodiff/autodiff.h"
#include "core/error.h"
#include "core/strings.h"
#include "global/array_ops.h"
#include "runtime/detail/spec_error.h"
#include "runtime/shard_map.h"
#include "runtime/tensor_ops.h"

namespace meshrt::autodiff {

using detail::cat;

namespace {

const AxisSet kNoAxes;

AxisSet spec_axes(const Mesh& mesh, const PartitionSpec& spec) {
  return unite(mesh, {}, spec.axes());
}

template <class T>
std::unordered_map<uint64_t, T>& cts_of(std::unordered_map<uint64_t, Tensor>& t,
                                        std::unordered_map<uint64_t, Array>& a) {
  if constexpr (std::is_same_v<T, Tensor>) {
    (void)a;
    return t;
  } else {
    (void)t;
    return a;
  }
}

template <class T>
void accumulate(std::unordered_map<uint64_t, T>& cts, uint64_t id, T ct) {
  auto it = cts.find(id);
  if (it == cts.end()) {
    cts.emplace(id, std::move(ct));
  } else {
    it->second = add(it->second, ct);
  }
}

}  // namespace

AxisSet unite(const Mesh& mesh, AxisSet a, const AxisSet& b) {
  for (const std::string& x : b) {
    if (std::find(a.begin(), a.end(), x) == a.end()) a.push_back(x);
  }
  std::sort(a.begin(), a.end(), [&](const std::string& l, const std::string& r) {
    return mesh.axis_position(l) < mesh.axis_position(r);
  });
  return a;
}

AxisSet minus(const AxisSet& a, const AxisSet& b) {
  AxisSet out;
  for (const std::string& x : a) {
    if (std::find(b.begin(), b.end(), x) == b.end()) out.push_back(x);
  }
  return out;
}

Tape::~Tape() = default;

void Tape::watch(Tensor& x, const std::string& path, AxisSet vma) {
  const uint64_t id = detail::next_trace_id();
  x.set_trace_id(id);
  known_.insert(id);
  paths_[id] = path;
  if (body_mesh_) vma_[id] = std::move(vma);
}

void Tape::watch(Array& x, const std::string& path) {
  const uint64_t id = detail::next_trace_id();
  x.set_trace_id(id);
  known_.insert(id);
  paths_[id] = path;
}

void Tape::note_vma(Tensor& x, AxisSet vma) {
  const uint64_t id = detail::next_trace_id();
  x.set_trace_id(id);
  vma_[id] = std::move(vma);
}

const AxisSet& Tape::vma_of(uint64_t id) const {
  auto it = vma_.find(id);
  return it == vma_.end() ? kNoAxes : it->second;
}

void Tape::record(detail::OpId op, std::span<const Tensor* const> inputs, std::span<Tensor> outputs,
                  const detail::OpAttrs& attrs) {
  record_node<Tensor>(op, inputs, outputs, attrs);
}
void Tape::record(detail::OpId op, std::span<const Array* const> inputs, std::span<Array> outputs,
                  const detail::OpAttrs& attrs) {
  if (body_mesh_) return;  // a body computes on Tensors
  record_node<Array>(op, inputs, outputs, attrs);
}

template <class T>
void Tape::record_node(detail::OpId op, std::span<const T* const> inputs, std::span<T> outputs,
                       const detail::OpAttrs& attrs) {
  bool followed = false;
  for (const T* x : inputs) followed |= follows(x->trace_id());
  bool body = false;
  if constexpr (std::is_same_v<T, Tensor>) body = body_mesh_.has_value();
  if (!followed && !body) return;

  // Body tapes: what the op computes over, and what its outputs vary over.
  AxisSet op_vma, out_vma;
  std::vector<AxisSet> in_vma;
  if (body) {
    const Mesh& mesh = *body_mesh_;
    for (const T* x : inputs) {
      in_vma.push_back(vma_of(x->trace_id()));
      op_vma = unite(mesh, op_vma, in_vma.back());
    }
    out_vma = op_vma;
    const detail::OpDef& def = detail::op_def(op);
    if (def.collective) {
      const AxisSet& axes = detail::collective_axes(attrs);
      op_vma = unite(mesh, op_vma, axes);
      out_vma = def.reduces_axes ? minus(op_vma, axes) : op_vma;
    }
  }
  bool float_out = false;
  for (const T& y : outputs) float_out |= is_floating(y.dtype());
  if (!followed || !float_out) {
    if (body) {
      for (T& y : outputs) {
        if (y.trace_id() == 0) y.set_trace_id(detail::next_trace_id());
        if (!out_vma.empty()) vma_[y.trace_id()] = out_vma;
      }
    }
    return;
  }
  const Rule<T>* rule = find_rule<T>(op);
  if (rule == nullptr) {
    throw Error(cat("[autodiff] ", detail::op_name(op),
                    " has no derivative (as in JAX): it was applied to a value being "
                    "differentiated; apply it to stop_gradient(x), or compute it outside the "
                    "differentiated function"));
  }
  Node<T> n;
  n.op = op;
  n.attrs = attrs;
  n.rule = rule;
  n.saved.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const T& x = *inputs[i];
    n.in.push_back(follows(x.trace_id()) && is_floating(x.dtype()) ? x.trace_id() : 0);
    n.in_meta.push_back(Meta<T>::of(x));
    if ((rule->saves_inputs >> i) & 1u) n.saved[i] = x;
  }
  follow_outputs(n, outputs, known_);
  if (body && !out_vma.empty()) {
    for (uint64_t id : n.out) vma_[id] = out_vma;
  }
  if (rule->saves_output) n.saved_out = outputs[0];
  if (body) {
    n.in_vma = std::move(in_vma);
    n.op_vma = std::move(op_vma);
  }
  nodes_.emplace_back(std::move(n));
}

void Tape::check_read(uint64_t trace_id, std::string_view what) {
  if (!follows(trace_id)) return;
  auto path = paths_.find(trace_id);
  throw Error(cat("[autodiff] ", what, " of a value being differentiated",
                  path == paths_.end() ? std::string() : cat(" (", path->second, ")"),
                  ": a gradient cannot flow through host memory. Read values after "
                  "value_and_grad / vjp returns, or read stop_gradient(x)"));
}

template <class T>
void Tape::run_node(Node<T>& node, Env& env) {
  auto& cts = cts_of<T>(tensor_cts_, array_cts_);
  CtList<T> out(node.out.size());
  bool any = false;
  for (size_t k = 0; k < node.out.size(); ++k) {
    auto it = cts.find(node.out[k]);
    if (it == cts.end()) continue;
    out[k] = std::move(it->second);
    cts.erase(it);
    any = true;
  }
  if (!any) return;
  if (!node.pullback) {  // one-output rules see their cotangent; several: zeros fill in
    for (size_t k = 0; k < out.size(); ++k) {
      if (!out[k] && node.out.size() == 1) out[k] = zeros_of(node.out_meta[k]);
    }
  }
  CtList<T> in = node.pullback ? node.pullback(out) : node.rule->vjp(node, out, env);
  for (size_t j = 0; j < node.in.size() && j < in.size(); ++j) {
    if (node.in[j] == 0 || !in[j]) continue;
    T ct = fit(std::move(*in[j]), node.in_meta[j]);
    if constexpr (std::is_same_v<T, Tensor>) {
      if (body_mesh_) {  // the implicit broadcast to the op's axes transposes to a psum
        const AxisSet missing = minus(node.op_vma, node.in_vma[j]);
        if (!missing.empty()) {
          if (env.ctx == nullptr)
            throw Error("[autodiff] a body's backward pass needs its Context");
          ct = env.ctx->psum(ct, AxisNames(missing));
        }
      }
    }
    accumulate(cts, node.in[j], std::move(ct));
  }
}

void Tape::backward(std::vector<std::pair<uint64_t, Tensor>> tensor_seeds,
                    std::vector<std::pair<uint64_t, Array>> array_seeds, Env& env) {
  if (used_) {
    throw Error(
        "[autodiff] this pullback already ran and its tape was freed: a pullback runs once; "
        "call vjp again for another cotangent");
  }
  used_ = true;
  for (auto& [id, ct] : tensor_seeds) {
    if (follows(id)) accumulate(tensor_cts_, id, std::move(ct));
  }
  for (auto& [id, ct] : array_seeds) {
    if (follows(id)) accumulate(array_cts_, id, std::move(ct));
  }
  while (!nodes_.empty()) {
    std::visit([&](auto& n) { run_node(n, env); }, nodes_.back());
    nodes_.pop_back();  // frees what the node saved
  }
}

std::optional<Tensor> Tape::tensor_grad(uint64_t id) {
  auto it = tensor_cts_.find(id);
  if (it == tensor_cts_.end()) return std::nullopt;
  Tensor g = std::move(it->second);
  tensor_cts_.erase(it);
  return g;
}

std::optional<Array> Tape::array_grad(uint64_t id) {
  auto it = array_cts_.find(id);
  if (it == array_cts_.end()) return std::nullopt;
  Array g = std::move(it->second);
  array_cts_.erase(it);
  return g;
}

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
    diff[i] = follows(args[i].trace_id()) && is_floating(args[i].dtype());
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
    Tape::Active on(*r.tape);
    std::vector<Tensor> ins = xs;
    for (size_t i = 0; i < ins.size(); ++i) {
      if (diff[i]) {
        r.tape->watch(ins[i], cat("shard_map input ", i), in_vma[i]);
        r.in_ids.push_back(ins[i].trace_id());
      } else {
        r.tape->note_vma(ins[i], in_vma[i]);
        r.in_ids.push_back(0);
      }
      r.in_meta.push_back(Meta<Tensor>::of(ins[i]));
    }
    std::vector<Tensor> outs = body(ctx, ins);
    for (size_t k = 0; k < outs.size(); ++k) {
      const uint64_t id = outs[k].trace_id();
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
    n.in.push_back(diff[i] ? args[i].trace_id() : 0);
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

Tape::Active::Active(Tape& tape) : previous_(detail::trace_state()) {
  state_ = previous_ != nullptr ? previous_ : &own_;
  if (previous_ == nullptr) detail::set_trace_state(&own_);
  state_->tracers.push_back(&tape);
}

Tape::Active::~Active() {
  state_->tracers.pop_back();
  if (previous_ == nullptr) detail::set_trace_state(nullptr);
}

}  // namespace meshrt::autodiff

// ---- the public entry points' side (autodiff.h)
namespace meshrt {

using detail::cat;

Tensor stop_gradient(const Tensor& x) {
  Tensor y = x;
  y.set_trace_id(0);
  return y;
}
Array stop_gradient(const Array& x) {
  Array y = x;
  y.set_trace_id(0);
  return y;
}

namespace autodiff_detail {

struct Recording::Seeds {
  std::vector<std::pair<uint64_t, Tensor>> tensors;
  std::vector<std::pair<uint64_t, Array>> arrays;
};
struct Recording::Active {
  explicit Active(autodiff::Tape& t) : on(t) {}
  autodiff::Tape::Active on;
};

Recording::Recording()
    : tape_(std::make_unique<autodiff::Tape>()), seeds_(std::make_unique<Seeds>()) {}
Recording::Recording(Recording&&) noexcept = default;
Recording& Recording::operator=(Recording&&) noexcept = default;
Recording::~Recording() = default;

namespace {
void check_float(DType dt, const std::string& path, const char* api) {
  if (is_floating(dt)) return;
  throw Error(cat("[", api, "] ", api, " requires real-valued (floating-point) inputs, but ", path,
                  " is ", dtype_name(dt),
                  " (as jax.grad). Pass integer data as an argument that is not differentiated "
                  "(argnums), or convert it with astype"));
}
}  // namespace

namespace {
// An input an outer tape follows (grad of grad, jvp): passed through an identity op the outer
// tapes record, so the inner tape's leaf is a new value they still see. True when one did.
template <class T>
bool through_outer_tapes(T& x) {
  if (x.trace_id() == 0 || !detail::tracing()) return false;
  detail::Traced<T> tr(detail::OpId::identity, {&x});
  x = tr(T(x));
  return x.trace_id() != 0;
}

// Both kinds of leaf: float only; keeps the id an outer tape gave it, else a fresh one.
template <class T>
void watch_leaf(autodiff::Tape& tape, T& x, const std::string& path, const char* api) {
  check_float(x.dtype(), path, api);
  if (through_outer_tapes(x)) {
    tape.watch_keeping_id(x, path);
  } else {
    tape.watch(x, path);
  }
}
}  // namespace

void Recording::watch(Tensor& x, const std::string& path, const char* api) {
  watch_leaf(*tape_, x, path, api);
}
void Recording::watch(Array& x, const std::string& path, const char* api) {
  watch_leaf(*tape_, x, path, api);
}
void Recording::start() { active_ = std::make_unique<Active>(*tape_); }
void Recording::stop() { active_.reset(); }

namespace {
[[noreturn]] void throw_used() {
  throw Error(
      "[autodiff] this pullback already ran and its tape was freed: a pullback runs once; call "
      "vjp again for another cotangent");
}
}  // namespace

void Recording::seed(const Tensor& out, const Tensor& ct) {
  if (tape_->used()) throw_used();
  seeds_->tensors.emplace_back(out.trace_id(), ct);
}
void Recording::seed(const Array& out, const Array& ct) {
  if (tape_->used()) throw_used();
  seeds_->arrays.emplace_back(out.trace_id(), ct);
}
void Recording::backward() {
  autodiff::Env env;
  tape_->backward(std::move(seeds_->tensors), std::move(seeds_->arrays), env);
  seeds_->tensors.clear();
  seeds_->arrays.clear();
}

Tensor Recording::grad(const Tensor& leaf, const std::string&) {
  std::optional<Tensor> g = tape_->tensor_grad(leaf.trace_id());
  if (!g) return zeros(leaf.shape(), leaf.dtype(), leaf.device());
  return autodiff::fit(*g, autodiff::Meta<Tensor>::of(leaf));
}

Array Recording::grad(const Array& leaf, const std::string& path) {
  std::optional<Array> g = tape_->array_grad(leaf.trace_id());
  if (!g) return zeros(leaf.shape(), leaf.dtype(), leaf.sharding());
  Array r = autodiff::fit(*g, autodiff::Meta<Array>::of(leaf));
  if (!path.empty() && !r.pending_sum_axes().empty()) {  // named where the CollectiveLog shows it
    const std::string made_by = meshrt::detail::pending_sum_origin(r);
    meshrt::detail::set_pending_sum_origin(
        r, cat("gradient of ", path, made_by.empty() ? "" : " (" + made_by + ")"));
  }
  if (leaf.sharding().same_mesh(r.sharding())) return with_sharding_constraint(r, leaf.sharding());
  return device_put(r, leaf.sharding());
}

void check_scalar_output(const Shape& shape, DType dtype, const char* api) {
  if (!shape.empty()) {
    throw Error(cat("[", api, "] ", api,
                    " requires a scalar (0-d) output, but the function returned shape ",
                    shape_str(shape), "; use vjp for non-scalar outputs (or reduce, e.g. sum)"));
  }
  if (!is_floating(dtype)) {
    throw Error(cat("[", api, "] ", api,
                    " requires a real-valued (floating-point) output, but the function returned ",
                    dtype_name(dtype)));
  }
}

void throw_no_leaves(const char* api, size_t argnum) {
  throw Error(cat("[", api, "] argument ", argnum,
                  " has no Array or Tensor to differentiate (argnums must name arguments that are "
                  "Arrays, Tensors, or trees holding them)"));
}

void throw_ct_structure(size_t outputs, size_t cotangents) {
  throw Error(cat("[vjp] the cotangent's structure does not match the output's: the output has ",
                  outputs, " leaves, the cotangent ", cotangents,
                  " (or a Tensor where the output has an Array); pass a cotangent shaped like the "
                  "output"));
}

}  // namespace autodiff_detail
}  // namespace meshrt
