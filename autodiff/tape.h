// autodiff/tape.h: reverse mode's record (not installed; the public API is autodiff.h).
//
// A Tape is a detail::Tracer: while it is active on a task, every differentiable op whose
// operands it follows is appended as a Node with what its rule (rules.cpp) needs saved; the
// backward pass walks the nodes once, newest first, hands each node's output cotangents to its
// rule, accumulates the input cotangents, and frees the node (saved values included) as soon as
// it is done. Why a tape and not a traced graph: ops run eagerly (their values are needed anyway,
// for the loss and for control flow), so recording what ran costs one append per op and needs
// no second interpreter.
//
// A body tape (one per device of a differentiated shard_map) also tracks, for every value the
// body makes, the mesh axes it varies over (JAX's vma): a value used next to one that varies
// over more axes was implicitly broadcast (pvary), whose transpose is a psum over those axes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "runtime/array.h"
#include "runtime/context.h"
#include "runtime/detail/access.h"
#include "runtime/detail/trace.h"
#include "runtime/mesh.h"
#include "runtime/tensor.h"

namespace meshrt::autodiff {

// What a value looked like (for zeros, unbroadcasting, casting back and placing gradients).
template <class T>
struct Meta;
template <>
struct Meta<Tensor> {
  Shape shape;
  DType dtype;
  Device device;
  static Meta of(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }
};
template <>
struct Meta<Array> {
  Shape shape;
  DType dtype;
  Sharding sharding;
  static Meta of(const Array& a) { return {a.shape(), a.dtype(), a.sharding()}; }
};

// Mesh axes, in mesh order.
using AxisSet = std::vector<std::string>;

template <class T>
struct Node;

// What a rule sees besides its node: the body's Context when the node ran in a shard_map body.
struct Env {
  Context* ctx = nullptr;
};

using Cts = std::vector<std::optional<Tensor>>;
template <class T>
using CtList = std::vector<std::optional<T>>;

// One entry of the rule table: the op, which operands (bit i: input i) and whether the output
// must be saved for the backward pass, and the vector-Jacobian product.
template <class T>
struct Rule {
  detail::OpId op;
  unsigned saves_inputs = 0;
  bool saves_output = false;
  // Cotangents of the inputs (nullopt: none) from those of the outputs (nullopt: zero).
  CtList<T> (*vjp)(const Node<T>& node, const CtList<T>& out_cts, Env& env) = nullptr;
};

// The rule for `op`, or nullptr when `op` has none (its OpDef says why: Derivative::zero, none).
template <class T>
const Rule<T>* find_rule(detail::OpId op);

template <class T>
struct Node {
  detail::OpId op = detail::OpId::identity;
  detail::OpAttrs attrs;
  std::vector<uint64_t> in;  // trace ids this tape follows (0: a constant operand)
  std::vector<Meta<T>> in_meta;
  std::vector<T> saved;  // per input; valid only where the rule saves it
  std::vector<uint64_t> out;
  std::vector<Meta<T>> out_meta;
  std::optional<T> saved_out;
  const Rule<T>* rule = nullptr;
  // Instead of a rule: a shard_map's pullback.
  std::function<CtList<T>(const CtList<T>&)> pullback;
  // Body tapes: the axes each input varies over and the axes the op computes over (their
  // difference is the implicit broadcast whose transpose is a psum).
  std::vector<AxisSet> in_vma;
  AxisSet op_vma;

  const T& input(size_t i) const { return saved[i]; }
  const T& output() const { return *saved_out; }
};

class Tape final : public detail::Tracer {
 public:
  // A global tape (value_and_grad's), or a body tape on `mesh` (one device of a shard_map).
  Tape() = default;
  explicit Tape(const Mesh& body_mesh) : body_mesh_(body_mesh) {}
  ~Tape() override;

  // Follows `x` (a fresh trace id on this copy) as an input to differentiate; `path` names it in
  // errors. A body tape gives the axes it varies over.
  void watch(Tensor& x, const std::string& path, AxisSet vma = {});
  void watch(Array& x, const std::string& path);
  // The same, keeping x's trace id: an outer tape made it for this very leaf (grad of grad).
  template <class T>
  void watch_keeping_id(const T& x, const std::string& path) {
    known_.insert(detail::trace_id(x));
    paths_[detail::trace_id(x)] = path;
  }
  // A body's constant input (not differentiated) that varies over `vma`.
  void note_vma(Tensor& x, AxisSet vma);
  bool follows(uint64_t id) const { return id != 0 && known_.count(id) != 0; }
  const AxisSet& vma_of(uint64_t id) const;

  // Runs the backward pass from `seeds` (trace id -> cotangent) once; afterwards grad() gives
  // each watched input's cotangent (nullopt when no path led to it). Frees the record.
  void backward(std::vector<std::pair<uint64_t, Tensor>> tensor_seeds,
                std::vector<std::pair<uint64_t, Array>> array_seeds, Env& env);
  bool used() const { return used_; }
  std::optional<Tensor> tensor_grad(uint64_t id);
  std::optional<Array> array_grad(uint64_t id);

  // detail::Tracer
  void record(detail::OpId op, std::span<const Tensor* const> inputs, std::span<Tensor> outputs,
              const detail::OpAttrs& attrs) override;
  void record(detail::OpId op, std::span<const Array* const> inputs, std::span<Array> outputs,
              const detail::OpAttrs& attrs) override;
  void check_read(uint64_t trace_id, std::string_view what) override;
  std::optional<std::vector<Array>> shard_map(detail::RunShardMap run,
                                              const detail::ErasedBody& body, const Mesh& mesh,
                                              const std::vector<PartitionSpec>& in_specs,
                                              const std::vector<PartitionSpec>& out_specs,
                                              const std::vector<Array>& args,
                                              const ShardMapOptions& options) override;

 private:
  template <class T>
  void record_node(detail::OpId op, std::span<const T* const> inputs, std::span<T> outputs,
                   const detail::OpAttrs& attrs);
  template <class T>
  void run_node(Node<T>& node, Env& env);

  std::optional<Mesh> body_mesh_;
  std::vector<std::variant<Node<Tensor>, Node<Array>>> nodes_;
  std::unordered_set<uint64_t> known_;               // watched inputs and recorded outputs
  std::unordered_map<uint64_t, std::string> paths_;  // watched inputs' paths
  std::unordered_map<uint64_t, AxisSet> vma_;        // body tapes: what each value varies over
  std::unordered_map<uint64_t, Tensor> tensor_cts_;
  std::unordered_map<uint64_t, Array> array_cts_;
  bool used_ = false;
};

// ---- what the tape and shard_map's transpose (shard_map_transpose.cpp) share
// Axis sets in mesh order: a and b together, and a without b.
AxisSet unite(const Mesh& mesh, AxisSet a, const AxisSet& b);
AxisSet minus(const AxisSet& a, const AxisSet& b);
// Gives a node's outputs fresh trace ids, added to `known` (the ids a tape follows).
template <class T>
void follow_outputs(Node<T>& n, std::span<T> outputs, std::unordered_set<uint64_t>& known) {
  for (T& y : outputs) {
    uint64_t id = detail::trace_id(y);
    if (id == 0) {  // else an outer tracer named this result already
      id = detail::next_trace_id();
      detail::set_trace_id(y, id);
    }
    known.insert(id);
    n.out.push_back(id);
    n.out_meta.push_back(Meta<T>::of(y));
  }
}

// ---- helpers the rules and the tape share (Tensor and Array overloads)
Tensor zeros_of(const Meta<Tensor>& m);
Array zeros_of(const Meta<Array>& m);
// A 0-d value `v` of x's dtype next to x (same device / mesh, replicated).
Tensor scalar_next_to(const Tensor& x, double v);
Array scalar_next_to(const Array& x, double v);
// `ct` summed over broadcast dimensions and cast so it matches `m` (shape and dtype).
template <class T>
T fit(T ct, const Meta<T>& m);

}  // namespace meshrt::autodiff
