// The tape: recording and the backward pass.
#include "autodiff/tape.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "core/strings.h"
#include "global/array_ops.h"
#include "runtime/detail/access.h"
#include "runtime/tensor_ops.h"

namespace meshrt::autodiff {

using detail::cat;

namespace {

const AxisSet kNoAxes;

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
  detail::set_trace_id(x, id);
  known_.insert(id);
  paths_[id] = path;
  if (body_mesh_) vma_[id] = std::move(vma);
}

void Tape::watch(Array& x, const std::string& path) {
  const uint64_t id = detail::next_trace_id();
  detail::set_trace_id(x, id);
  known_.insert(id);
  paths_[id] = path;
}

void Tape::note_vma(Tensor& x, AxisSet vma) {
  const uint64_t id = detail::next_trace_id();
  detail::set_trace_id(x, id);
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
  for (const T* x : inputs) followed |= follows(detail::trace_id(*x));
  bool body = false;
  if constexpr (std::is_same_v<T, Tensor>) body = body_mesh_.has_value();
  if (!followed && !body) return;

  // Body tapes: what the op computes over, and what its outputs vary over.
  AxisSet op_vma, out_vma;
  std::vector<AxisSet> in_vma;
  if (body) {
    const Mesh& mesh = *body_mesh_;
    for (const T* x : inputs) {
      in_vma.push_back(vma_of(detail::trace_id(*x)));
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
        if (detail::trace_id(y) == 0) detail::set_trace_id(y, detail::next_trace_id());
        if (!out_vma.empty()) vma_[detail::trace_id(y)] = out_vma;
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
    n.in.push_back(follows(detail::trace_id(x)) && is_floating(x.dtype()) ? detail::trace_id(x)
                                                                          : 0);
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

}  // namespace meshrt::autodiff
