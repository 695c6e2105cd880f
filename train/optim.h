// train/optim.h: optax's optimizers and learning-rate schedules over trees of Arrays.
//
//   auto opt = optim::chain(optim::clip_by_global_norm(1.0),
//                           optim::adamw(optim::warmup_cosine_decay(0.0, 1e-3, 100, 1000)));
//   auto state = opt.init(params);                                // sharded like params
//   auto [updates, new_state] = opt.update(grads, state, params);
//   params = optim::apply_updates(params, updates);
//
// optax's model: an optimizer (a GradientTransformation) is a pair of pure functions, init and
// update; chain composes them in order. Params, grads and updates are trees (runtime/tree.h:
// MESHRT_TREE structs, vectors, maps, one Array) of float Arrays; every computation is a
// global-view Array op, so moments are made and updated on their parameter's sharding (FSDP
// keeps sharded Adam moments, with no gather), and the whole step runs under jit (donating
// params and state updates them in place) and under value_and_grad.
//
// Values are optax's (optax 0.2.8, jax_enable_x64 off as optax is used): the same
// float32 operations in the same order, the step count an int32 scalar, schedules evaluated at
// the count before it is incremented, Adam's bias correction 1 - b^t with t the incremented
// count and eps outside the square root, adamw's weight decay added to the Adam direction before
// the learning rate (decoupled, every leaf decayed: optax's mask-free default),
// clip_by_global_norm's t / ||g|| * max_norm where ||g|| >= max_norm, nesterov sgd as optax's
// trace. b^t and the cosine are computed in float64 and rounded once (XLA's float32 pow and cos
// are within an ulp of that); tests/test_optim.cpp compares against values optax computed.
//
// Low precision (bfloat16 / float16 params and grads) as optax: moments are zeros of their
// parameter's dtype unless a transform is given a state dtype (adam's `mu_dtype`, sgd's and
// trace's `accumulator_dtype`); each update's arithmetic follows JAX's promotion (bf16 grads with
// an f32 mu give an f32 mu and f32 updates, while nu stays bf16), bias correction is divided in
// each moment's dtype, a scheduled weight decay (float32) promotes the update to float32, and
// apply_updates casts back to the parameter's dtype.
//
// Thread-safety: optimizers and schedules are immutable after construction; share them freely.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "global/array_ops.h"
#include "runtime/array.h"
#include "runtime/sharding.h"
#include "runtime/tree.h"

namespace meshrt::optim {

// ---- schedules

// A learning-rate (or weight-decay) schedule: the step count (an int32 scalar Array) to a
// float32 scalar Array on the count's sharding (optax.Schedule). Copies share the function.
class Schedule {
 public:
  // The function: the step count (an int32 scalar Array) to a float32 scalar Array.
  using Fn = std::function<Array(const Array& count)>;
  // A schedule named `name` (shown by name() and in optimizer names) computing `fn`; the
  // functions below make the optax ones.
  Schedule(std::string name, Fn fn);

  // The value at `count` (an int32 scalar Array): a float32 scalar Array on count's sharding.
  // Ops only, so it runs under jit.
  Array operator()(const Array& count) const;
  // The value at `step` on the host (evaluated on this process's first device), e.g. to log it.
  double at(int64_t step) const;
  // "warmup_cosine_decay(init=0, peak=0.001, warmup_steps=100, decay_steps=1000, end=0)".
  const std::string& name() const { return *name_; }

 private:
  std::shared_ptr<const std::string> name_;
  std::shared_ptr<const Fn> fn_;
};

// optax.constant_schedule(value).
Schedule constant(double value);
// optax.linear_schedule(init, end, transition_steps, transition_begin): init until
// transition_begin, then linearly to end over transition_steps, then end; transition_steps <= 0
// gives constant(init), a negative transition_begin counts as 0 (as optax).
Schedule linear_schedule(double init, double end, int64_t transition_steps,
                         int64_t transition_begin = 0);
// A linear warmup from init to peak over `steps` steps: optax.linear_schedule(init, peak, steps).
Schedule linear_warmup(double init, double peak, int64_t steps);
// optax.cosine_decay_schedule(init, decay_steps, alpha): init * ((1 - alpha) * (1 + cos(pi *
// min(t, decay_steps) / decay_steps)) / 2 + alpha). decay_steps <= 0 is an Error.
Schedule cosine_decay(double init, int64_t decay_steps, double alpha = 0.0);
// optax.warmup_cosine_decay_schedule(init, peak, warmup_steps, decay_steps, end): linear_warmup
// (init, peak, warmup_steps), then cosine_decay(peak, decay_steps - warmup_steps, end / peak)
// (decay_steps counts the warmup, as optax's).
Schedule warmup_cosine_decay(double init, double peak, int64_t warmup_steps, int64_t decay_steps,
                             double end = 0.0);
// optax.join_schedules: schedules[0] until boundaries[0], then schedules[i + 1](t - boundaries[i])
// from boundaries[i] on. One boundary fewer than schedules.
Schedule join_schedules(std::vector<Schedule> schedules, std::vector<int64_t> boundaries);

// A learning rate (or weight decay): a number or a Schedule (optax.ScalarOrSchedule). A number
// keeps no step count in the state; a Schedule (constant(v) too) keeps one, as in optax.
class ScalarOrSchedule {
 public:
  // A constant number (implicit, as optax takes floats).
  ScalarOrSchedule(double value) : value_(value) {}  // NOLINT: implicit, as optax takes floats
  // A schedule of the step count (implicit).
  ScalarOrSchedule(Schedule schedule)  // NOLINT
      : schedule_(std::make_shared<Schedule>(std::move(schedule))) {}
  // True for a Schedule, false for a number.
  bool is_schedule() const { return schedule_ != nullptr; }
  double value() const;              // the number; an Error for a Schedule
  const Schedule& schedule() const;  // the Schedule; an Error for a number
  // The number as text ("0.001") or the schedule's name(), for optimizer names.
  std::string str() const;

 private:
  double value_ = 0.0;
  std::shared_ptr<const Schedule> schedule_;
};

// ---- optimizer state

// One transform's state (optax's per-transform NamedTuple): `scalars` holds the replicated
// int32 step count ("count") where the transform keeps one; `trees` holds per-parameter
// moments ("mu", "nu", "trace"), each a tree of params' structure whose leaves have their
// parameter's shape and sharding and their parameter's dtype (or the state dtype the transform
// was given: adam's mu_dtype, trace's accumulator_dtype). `name` is the transform's
// ("scale_by_adam"), static.
template <class Params>
struct TransformState {
  std::string name;                      // the transform's name ("scale_by_adam"), static
  std::map<std::string, Array> scalars;  // replicated scalars: "count" where kept
  std::map<std::string, Params> trees;   // per-parameter moments: "mu", "nu", "trace"
};
MESHRT_TREE_DEFINE(template <class Params>, TransformState<Params>, name, scalars, trees)

// An optimizer's state: one TransformState per transform of the chain, in order (optax's tuple
// of states, nested chains flattened). A tree: jit takes it as an argument and returns it, and
// donating it updates the moments in place; tree paths read
// "state.parts[1].trees['mu'].w1".
template <class Params>
struct State {
  std::vector<TransformState<Params>> parts;  // one per transform of the chain, in order

  // The step count of the first transform that keeps one (an int32 scalar Array), else an
  // Error. Read it with to_vector<int32_t>() outside jit.
  const Array& count() const {
    for (const auto& p : parts) {
      auto it = p.scalars.find("count");
      if (it != p.scalars.end()) return it->second;
    }
    throw Error("[optim] State::count: no transform of this optimizer keeps a step count");
  }
};
MESHRT_TREE_DEFINE(template <class Params>, State<Params>, parts)

namespace detail {

// One transform's state on flat leaf lists (the tree-independent core works on these).
struct FlatState {
  std::map<std::string, Array> scalars;
  std::map<std::string, std::vector<Array>> slots;  // one Array per parameter leaf, tree order
};

// A gradient transformation on the leaves of a tree, in tree order (the type-erased core).
class Transform {
 public:
  virtual ~Transform() = default;
  virtual const char* name() const = 0;
  // `scalar_sharding`: where replicated scalars (the count) live.
  virtual FlatState init(const std::vector<Array>& params,
                         const Sharding& scalar_sharding) const = 0;
  // `params` is null when update was called without them; `paths` name the leaves for errors.
  virtual std::vector<Array> update(std::vector<Array> updates, FlatState& state,
                                    const std::vector<Array>* params,
                                    const std::vector<std::string>& paths) const = 0;
};
using TransformPtr = std::shared_ptr<const Transform>;

// Where replicated scalars of a state for these parameter leaves live: P() on the first leaf's
// mesh (its device for a single-device leaf; this process's first device without leaves).
Sharding scalar_sharding_for(const std::vector<Array>& params);
std::vector<FlatState> init_flat(const std::vector<TransformPtr>& ts,
                                 const std::vector<Array>& params);
std::vector<Array> update_flat(const std::vector<TransformPtr>& ts, std::vector<Array> updates,
                               std::vector<FlatState>& states, const std::vector<Array>* params,
                               const std::vector<std::string>& paths);
// Leaf checks of update: grads against params and the state's moments (shape, dtype, float).
void check_leaves(const std::vector<Array>& grads, const std::vector<std::string>& paths,
                  const std::vector<Array>* params, const std::vector<FlatState>& states);
[[noreturn]] void throw_state_mismatch(const std::string& what);
std::string part_path(size_t i);

template <class Tree>
std::vector<std::string> leaf_paths(const Tree& tree) {
  std::vector<std::string> paths;
  tree_visit(tree, [&paths](const auto&, const std::string& path) { paths.push_back(path); });
  return paths;
}

}  // namespace detail

// ---- optimizers

// An optimizer: optax's GradientTransformation, a list of transforms applied in order. Copies
// share the transforms.
class GradientTransformation {
 public:
  // The transforms, applied in order; the functions below (sgd, adam, chain, ...) make them.
  explicit GradientTransformation(std::vector<detail::TransformPtr> transforms)
      : transforms_(std::move(transforms)) {}

  // The state for `params` (a tree of float Arrays): moments are zeros shaped and sharded like
  // each parameter, of its dtype unless the transform names a state dtype; counts are int32 zeros
  // replicated on the parameters' mesh.
  template <class Params>
  State<Params> init(const Params& params) const {
    const std::vector<Array> leaves = tree_leaves(params);
    std::vector<detail::FlatState> flat = detail::init_flat(transforms_, leaves);
    State<Params> state;
    for (size_t i = 0; i < flat.size(); ++i) {
      TransformState<Params> part;
      part.name = transforms_[i]->name();
      part.scalars = std::move(flat[i].scalars);
      for (auto& [key, slot] : flat[i].slots) part.trees.emplace(key, tree_unflatten(params, slot));
      state.parts.push_back(std::move(part));
    }
    return state;
  }

  // One step: (updates, new state) from the gradients, the state init made and the current
  // parameters (optax's update(grads, state, params)). `grads` has params' structure; updates
  // have grads' structure. A mismatched tree or leaf is an Error naming the path.
  template <class Grads, class Params>
  std::pair<Grads, State<Params>> update(const Grads& grads, const State<Params>& state,
                                         const Params& params) const {
    check_tree_structure(grads, params, "optim update (the gradients against the parameters)");
    const std::vector<Array> p = tree_leaves(params);
    return update_impl(grads, state, &p);
  }
  // The same without parameters (optax's params=None): an Error if a transform needs them
  // (add_decayed_weights, so adamw).
  template <class Grads, class Params>
  std::pair<Grads, State<Params>> update(const Grads& grads, const State<Params>& state) const {
    return update_impl(grads, state, nullptr);
  }

  // The transforms, in order (nested chains flattened).
  const std::vector<detail::TransformPtr>& transforms() const { return transforms_; }

 private:
  template <class Grads, class Params>
  std::pair<Grads, State<Params>> update_impl(const Grads& grads, const State<Params>& state,
                                              const std::vector<Array>* params) const {
    const std::vector<Array> g = tree_leaves(grads);
    const std::vector<std::string> paths = detail::leaf_paths(grads);
    if (state.parts.size() != transforms_.size()) {
      detail::throw_state_mismatch("the state has " + std::to_string(state.parts.size()) +
                                   " parts but the optimizer has " +
                                   std::to_string(transforms_.size()) + " transforms");
    }
    std::vector<detail::FlatState> flat(state.parts.size());
    for (size_t i = 0; i < state.parts.size(); ++i) {
      const TransformState<Params>& part = state.parts[i];
      if (part.name != transforms_[i]->name()) {
        detail::throw_state_mismatch(detail::part_path(i) + " is a '" + part.name +
                                     "' state but transform " + std::to_string(i) +
                                     " of the optimizer is '" + transforms_[i]->name() + "'");
      }
      flat[i].scalars = part.scalars;
      for (const auto& [key, tree] : part.trees) {
        check_tree_structure(grads, tree,
                             "optim update (the gradients against " + detail::part_path(i) +
                                 ".trees['" + key + "'])");
        flat[i].slots.emplace(key, tree_leaves(tree));
      }
    }
    detail::check_leaves(g, paths, params, flat);
    std::vector<Array> u = detail::update_flat(transforms_, g, flat, params, paths);
    State<Params> out;
    for (size_t i = 0; i < flat.size(); ++i) {
      TransformState<Params> part;
      part.name = state.parts[i].name;
      part.scalars = std::move(flat[i].scalars);
      for (auto& [key, slot] : flat[i].slots) {
        part.trees.emplace(key, tree_unflatten(state.parts[i].trees.at(key), slot));
      }
      out.parts.push_back(std::move(part));
    }
    return {tree_unflatten(grads, u), std::move(out)};
  }

  std::vector<detail::TransformPtr> transforms_;
};

// Applies the transforms of each argument in order (optax.chain); nested chains flatten, so the
// state has one part per transform.
GradientTransformation chain(const std::vector<GradientTransformation>& transforms);
// chain(a, b, ...): the same with the transformations as arguments.
template <class... T>
GradientTransformation chain(const GradientTransformation& first, const T&... rest) {
  return chain(std::vector<GradientTransformation>{first, rest...});
}

// optax.sgd: chain(trace(momentum, nesterov, accumulator_dtype) or identity() when momentum == 0
// (optax's momentum=None), scale_by_learning_rate(lr)). `accumulator_dtype` (optax's
// accumulator_dtype): the momentum's dtype, e.g. DType::f32 for bfloat16 params; unset, the
// parameter's.
GradientTransformation sgd(ScalarOrSchedule lr, double momentum = 0.0, bool nesterov = false,
                           std::optional<DType> accumulator_dtype = std::nullopt);
// optax.adam: chain(scale_by_adam(b1, b2, eps, 0, mu_dtype), scale_by_learning_rate(lr)).
// `mu_dtype` (optax's): the first moment's dtype, e.g. DType::f32 for bfloat16 params (nu keeps
// the parameter's dtype, as optax); unset, the parameter's.
GradientTransformation adam(ScalarOrSchedule lr, double b1 = 0.9, double b2 = 0.999,
                            double eps = 1e-8, std::optional<DType> mu_dtype = std::nullopt);
// optax.adamw: chain(scale_by_adam(b1, b2, eps, 0, mu_dtype), add_decayed_weights(weight_decay),
// scale_by_learning_rate(lr)): the decay is scaled by the learning rate, not by Adam's
// normalization; every leaf is decayed. `mu_dtype` as adam's.
GradientTransformation adamw(ScalarOrSchedule lr, double b1 = 0.9, double b2 = 0.999,
                             double eps = 1e-8, ScalarOrSchedule weight_decay = 1e-4,
                             std::optional<DType> mu_dtype = std::nullopt);

// ---- the transforms optimizers are made of (optax's names)

// Passes updates through (optax.identity).
GradientTransformation identity();
// updates * step_size (optax.scale).
GradientTransformation scale(double step_size);
// updates * schedule(count), count then incremented (optax.scale_by_schedule).
GradientTransformation scale_by_schedule(Schedule schedule);
// updates * -lr: scale(-lr) for a number, scale_by_schedule(-lr(count)) for a schedule
// (optax.scale_by_learning_rate); flip_sign = false keeps the sign.
GradientTransformation scale_by_learning_rate(ScalarOrSchedule lr, bool flip_sign = true);
// Momentum (optax.trace): t = g + decay * t; updates t, or g + decay * t with nesterov. The trace
// starts as zeros of `accumulator_dtype` (unset: the parameter's dtype) and is cast to it after
// each step (optax's accumulator_dtype).
GradientTransformation trace(double decay, bool nesterov = false,
                             std::optional<DType> accumulator_dtype = std::nullopt);
// Adam's direction (optax.scale_by_adam): mu = (1 - b1) g + b1 mu, nu = (1 - b2) g^2 + b2 nu,
// t = count + 1, updates (mu / (1 - b1^t)) / (sqrt(nu / (1 - b2^t) + eps_root) + eps), each
// bias correction cast to its moment's dtype. mu starts as zeros of `mu_dtype` (unset: the
// parameter's dtype) and is cast to it after each step; nu keeps its dtype (optax's mu_dtype).
GradientTransformation scale_by_adam(double b1 = 0.9, double b2 = 0.999, double eps = 1e-8,
                                     double eps_root = 0.0,
                                     std::optional<DType> mu_dtype = std::nullopt);
// updates + weight_decay * params (optax.add_decayed_weights; needs the params). A schedule
// keeps a count (its float32 value promotes bfloat16 updates to float32, as in optax); a
// constant 0 passes updates through.
GradientTransformation add_decayed_weights(ScalarOrSchedule weight_decay);
// Rescales every update by max_norm / ||updates|| when the global norm (the square root of the
// sum over leaves of the sums of squares) is >= max_norm (optax.clip_by_global_norm). Under
// sharding the norm's sums are one psum.
GradientTransformation clip_by_global_norm(double max_norm);

// params + updates, leaf by leaf, cast back to each parameter's dtype (optax.apply_updates).
// A structure mismatch is an Error naming the path.
template <class Params, class Updates>
Params apply_updates(const Params& params, const Updates& updates) {
  check_tree_structure(params, updates,
                       "optim::apply_updates (the parameters against the updates)");
  return tree_map(
      [](const Array& p, const Array& u) {
        Array s = p + u;
        return s.dtype() == p.dtype() ? s : astype(s, p.dtype());
      },
      params, updates);
}

}  // namespace meshrt::optim
