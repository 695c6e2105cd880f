// train/optim.cpp: optax's transforms and schedules on flat leaf lists, as global-view Array ops.
//
// Each transform mirrors its optax function line by line: the same operations in the same
// order and dtypes (JAX's promotion: bf16 with f32 gives f32), Python floats as weak scalars
// (meshrt's double Scalars take the Array's float dtype, as JAX's weak types do), the count an
// int32 Array. JAX runs optax with x64 off, where int32 / int and float * int32 give float32: those
// places cast the count to f32 explicitly (meshrt follows x64 promotion, which would give float64).
#include "train/optim.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <sstream>

#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/device.h"
#include "runtime/partition_spec.h"

namespace meshrt::optim {

using meshrt::detail::cat;

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// b ** t for an int32 count t (jnp.power(b, t): XLA's float32 pow of float32(b)): computed in
// float64 and rounded once, the correctly rounded value XLA's pow is within an ulp of.
Array power_of_count(double b, const Array& t) {
  const double log_b = std::log(static_cast<double>(static_cast<float>(b)));
  return astype(exp(astype(t, DType::f64) * log_b), DType::f32);
}

// cos of a float32 Array, correctly rounded (through float64), the same on every platform.
Array cos_f32(const Array& x) { return astype(cos(astype(x, DType::f64)), DType::f32); }

// optax.safe_increment: count + 1, saturating at the int32 maximum.
Array safe_increment(const Array& count) {
  return minimum(count, Scalar(std::numeric_limits<int32_t>::max() - 1)) + Scalar(1);
}

Array zero_count(const Sharding& s) { return zeros({}, DType::i32, s); }

}  // namespace

// ---------------------------------------------------------------- schedules

Schedule::Schedule(std::string name, Fn fn)
    : name_(std::make_shared<const std::string>(std::move(name))),
      fn_(std::make_shared<const Fn>(std::move(fn))) {}

Array Schedule::operator()(const Array& count) const {
  if (count.dtype() != DType::i32 || !count.shape().empty()) {
    throw Error(cat("[optim] schedule ", *name_, ": the count is an int32 scalar Array, got ",
                    dtype_name(count.dtype()), shape_str(count.shape())));
  }
  Array v = (*fn_)(count);
  return v.dtype() == DType::f32 ? v : astype(v, DType::f32);
}

double Schedule::at(int64_t step) const {
  if (step < 0 || step > std::numeric_limits<int32_t>::max()) {
    throw Error(cat("[optim] schedule ", *name_, ".at(", step,
                    "): the step count is an int32 (0 to 2147483647)"));
  }
  const std::vector<int32_t> c{static_cast<int32_t>(step)};
  Array count = device_put(c, Shape{}, SingleDeviceSharding(local_devices().at(0)));
  return static_cast<double>((*this)(count).to_vector<float>().at(0));
}

Schedule constant(double value) {
  return Schedule(cat("constant(", num(value), ")"), [value](const Array& count) {
    return full({}, value, DType::f32, count.sharding());
  });
}

Schedule linear_schedule(double init, double end, int64_t transition_steps,
                         int64_t transition_begin) {
  const std::string name =
      cat("linear_schedule(init=", num(init), ", end=", num(end),
          ", transition_steps=", transition_steps, ", transition_begin=", transition_begin, ")");
  if (transition_steps <= 0) {
    Schedule c = constant(init);
    return Schedule(name, [c](const Array& count) { return c(count); });
  }
  const int64_t begin = std::max<int64_t>(transition_begin, 0);
  return Schedule(name, [=](const Array& count) {
    // count = clip(count - begin, 0, steps); frac = 1 - count / steps (float32)
    Array c = minimum(maximum(count - Scalar(begin), Scalar(0)), Scalar(transition_steps));
    Array frac = 1.0 - astype(c, DType::f32) / static_cast<double>(transition_steps);
    return (init - end) * frac + end;
  });
}

Schedule linear_warmup(double init, double peak, int64_t steps) {
  return linear_schedule(init, peak, steps);
}

Schedule cosine_decay(double init, int64_t decay_steps, double alpha) {
  if (decay_steps <= 0) {
    throw Error(cat("[optim] cosine_decay needs decay_steps > 0, got ", decay_steps,
                    " (optax.cosine_decay_schedule raises the same)"));
  }
  const double steps = static_cast<double>(decay_steps);
  return Schedule(cat("cosine_decay(init=", num(init), ", decay_steps=", decay_steps,
                      ", alpha=", num(alpha), ")"),
                  [=](const Array& count) {
                    Array c = minimum(astype(count, DType::f32), steps);
                    Array cosine = 0.5 * (1.0 + cos_f32(std::numbers::pi * c / steps));
                    Array decayed = (1.0 - alpha) * cosine + alpha;
                    return init * decayed;
                  });
}

Schedule warmup_cosine_decay(double init, double peak, int64_t warmup_steps, int64_t decay_steps,
                             double end) {
  const double alpha = peak == 0.0 ? 0.0 : end / peak;
  Schedule joined = join_schedules({linear_schedule(init, peak, warmup_steps),
                                    cosine_decay(peak, decay_steps - warmup_steps, alpha)},
                                   {warmup_steps});
  return Schedule(
      cat("warmup_cosine_decay(init=", num(init), ", peak=", num(peak),
          ", warmup_steps=", warmup_steps, ", decay_steps=", decay_steps, ", end=", num(end), ")"),
      [joined](const Array& count) { return joined(count); });
}

Schedule join_schedules(std::vector<Schedule> schedules, std::vector<int64_t> boundaries) {
  if (schedules.empty() || boundaries.size() + 1 != schedules.size()) {
    throw Error(cat("[optim] join_schedules takes one boundary fewer than schedules; got ",
                    schedules.size(), " schedules and ", boundaries.size(), " boundaries"));
  }
  std::string name = "join_schedules(";
  for (size_t i = 0; i < schedules.size(); ++i) {
    name += (i == 0 ? "" : ", ") + schedules[i].name();
    if (i < boundaries.size()) name += cat(", ", boundaries[i]);
  }
  name += ")";
  return Schedule(name, [schedules, boundaries](const Array& count) {
    Array out = schedules[0](count);
    for (size_t i = 0; i < boundaries.size(); ++i) {
      const Scalar b(boundaries[i]);
      out = where(count < b, out, schedules[i + 1](count - b));
    }
    return out;
  });
}

double ScalarOrSchedule::value() const {
  if (schedule_) throw Error("[optim] ScalarOrSchedule::value: this is a schedule, not a number");
  return value_;
}

const Schedule& ScalarOrSchedule::schedule() const {
  if (!schedule_) throw Error("[optim] ScalarOrSchedule::schedule: this is a number");
  return *schedule_;
}

std::string ScalarOrSchedule::str() const { return schedule_ ? schedule_->name() : num(value_); }

// ---------------------------------------------------------------- the flat core

namespace detail {

Sharding scalar_sharding_for(const std::vector<Array>& params) {
  if (params.empty()) return SingleDeviceSharding(local_devices().at(0));
  const Sharding& s = params.front().sharding();
  if (const std::optional<NamedSharding> named = s.as_named())
    return NamedSharding(named->mesh(), P());
  return s;
}

std::vector<FlatState> init_flat(const std::vector<TransformPtr>& ts,
                                 const std::vector<Array>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (meshrt::detail::ArrayAccess::blocks(params[i]).empty()) {
      throw Error(cat("[optim] init: parameter leaf ", i,
                      " is an empty (default-constructed, moved-from or donated) Array"));
    }
  }
  const Sharding s = scalar_sharding_for(params);
  std::vector<FlatState> out;
  for (const TransformPtr& t : ts) out.push_back(t->init(params, s));
  return out;
}

std::vector<Array> update_flat(const std::vector<TransformPtr>& ts, std::vector<Array> updates,
                               std::vector<FlatState>& states, const std::vector<Array>* params,
                               const std::vector<std::string>& paths) {
  for (size_t i = 0; i < ts.size(); ++i) {
    updates = ts[i]->update(std::move(updates), states[i], params, paths);
  }
  return updates;
}

std::string part_path(size_t i) { return cat("state.parts[", i, "]"); }

void throw_state_mismatch(const std::string& what) {
  throw Error(cat("[optim] update: ", what,
                  "; pass the state this optimizer's init (or its last update) returned"));
}

void check_leaves(const std::vector<Array>& grads, const std::vector<std::string>& paths,
                  const std::vector<Array>* params, const std::vector<FlatState>& states) {
  for (size_t k = 0; k < grads.size(); ++k) {
    const Array& g = grads[k];
    if (meshrt::detail::ArrayAccess::blocks(g).empty()) {
      throw Error(cat("[optim] update: the gradient at ", paths[k],
                      " is an empty (default-constructed, moved-from or donated) Array"));
    }
    if (!is_floating(g.dtype())) {
      throw Error(cat("[optim] update: the gradient at ", paths[k], " is ", dtype_name(g.dtype()),
                      "; optimizers take float Arrays"));
    }
    if (params != nullptr) {
      const Array& p = (*params)[k];
      if (p.shape() != g.shape()) {
        throw Error(cat("[optim] update: the gradient at ", paths[k], " has shape ",
                        shape_str(g.shape()), " but the parameter there has ",
                        shape_str(p.shape())));
      }
    }
    for (size_t i = 0; i < states.size(); ++i) {
      for (const auto& [key, slot] : states[i].slots) {
        const Array& m = slot[k];
        if (meshrt::detail::ArrayAccess::blocks(m).empty()) {
          throw Error(cat("[optim] update: ", part_path(i), ".trees['", key, "'] at ", paths[k],
                          " is an empty (donated or moved-from) Array; pass the state the last "
                          "call returned"));
        }
        if (m.shape() != g.shape()) {
          throw Error(cat("[optim] update: the gradient at ", paths[k], " has shape ",
                          shape_str(g.shape()), " but ", part_path(i), ".trees['", key, "'] holds ",
                          shape_str(m.shape()), " there"));
        }
      }
    }
  }
  for (size_t i = 0; i < states.size(); ++i) {
    for (const auto& [key, c] : states[i].scalars) {
      if (meshrt::detail::ArrayAccess::blocks(c).empty() || c.dtype() != DType::i32 ||
          !c.shape().empty()) {
        throw Error(cat("[optim] update: ", part_path(i), ".scalars['", key,
                        "'] is not an int32 scalar Array (empty after donation?)"));
      }
    }
  }
}

}  // namespace detail

// ---------------------------------------------------------------- transforms

namespace {

using detail::FlatState;
using detail::Transform;

// optax.tree.zeros_like(xs, dtype): zeros like each leaf, of `dtype` where given.
std::vector<Array> zeros_like(const std::vector<Array>& xs, std::optional<DType> dtype) {
  std::vector<Array> out;
  out.reserve(xs.size());
  for (const Array& x : xs)
    out.push_back(zeros(x.shape(), dtype.value_or(x.dtype()), x.sharding()));
  return out;
}

// x.astype(dtype) where they differ.
Array cast_to(const Array& x, DType dtype) { return x.dtype() == dtype ? x : astype(x, dtype); }

// optax.tree.cast(x, dtype): x cast to `dtype` where given.
Array cast_to(const Array& x, std::optional<DType> dtype) { return dtype ? cast_to(x, *dtype) : x; }

// A state dtype (mu_dtype, accumulator_dtype) must be a float dtype.
std::optional<DType> state_dtype(const char* what, std::optional<DType> dtype) {
  if (dtype && !is_floating(*dtype)) {
    throw Error(cat("[optim] ", what, " must be a float dtype (float32, bfloat16, ...), got ",
                    dtype_name(*dtype)));
  }
  return dtype;
}

const std::vector<Array>& need_params(const char* name, const std::vector<Array>* params) {
  if (params == nullptr) {
    throw Error(cat("[optim] ", name, " needs the parameters: call update(grads, state, params)"));
  }
  return *params;
}

class Identity final : public Transform {
 public:
  const char* name() const override { return "identity"; }
  FlatState init(const std::vector<Array>&, const Sharding&) const override { return {}; }
  std::vector<Array> update(std::vector<Array> u, FlatState&, const std::vector<Array>*,
                            const std::vector<std::string>&) const override {
    return u;
  }
};

class Scale final : public Transform {
 public:
  explicit Scale(double step) : step_(step) {}
  const char* name() const override { return "scale"; }
  FlatState init(const std::vector<Array>&, const Sharding&) const override { return {}; }
  std::vector<Array> update(std::vector<Array> u, FlatState&, const std::vector<Array>*,
                            const std::vector<std::string>&) const override {
    for (Array& g : u) g = step_ * g;
    return u;
  }

 private:
  double step_;
};

class ScaleBySchedule final : public Transform {
 public:
  explicit ScaleBySchedule(Schedule s) : schedule_(std::move(s)) {}
  const char* name() const override { return "scale_by_schedule"; }
  FlatState init(const std::vector<Array>&, const Sharding& s) const override {
    FlatState st;
    st.scalars.emplace("count", zero_count(s));
    return st;
  }
  std::vector<Array> update(std::vector<Array> u, FlatState& st, const std::vector<Array>*,
                            const std::vector<std::string>&) const override {
    Array& count = st.scalars.at("count");
    const Array step = schedule_(count);
    for (Array& g : u) g = (g.dtype() == step.dtype() ? step : astype(step, g.dtype())) * g;
    count = safe_increment(count);
    return u;
  }

 private:
  Schedule schedule_;
};

class Trace final : public Transform {
 public:
  Trace(double decay, bool nesterov, std::optional<DType> acc)
      : decay_(decay), nesterov_(nesterov), acc_(state_dtype("trace's accumulator_dtype", acc)) {}
  const char* name() const override { return "trace"; }
  FlatState init(const std::vector<Array>& params, const Sharding&) const override {
    FlatState st;
    st.slots.emplace("trace", zeros_like(params, acc_));
    return st;
  }
  std::vector<Array> update(std::vector<Array> u, FlatState& st, const std::vector<Array>*,
                            const std::vector<std::string>&) const override {
    std::vector<Array>& t = st.slots.at("trace");
    for (size_t k = 0; k < u.size(); ++k) {
      const Array new_trace = u[k] + decay_ * t[k];
      u[k] = nesterov_ ? u[k] + decay_ * new_trace : new_trace;
      t[k] = cast_to(new_trace, acc_);
    }
    return u;
  }

 private:
  double decay_;
  bool nesterov_;
  std::optional<DType> acc_;
};

class ScaleByAdam final : public Transform {
 public:
  ScaleByAdam(double b1, double b2, double eps, double eps_root, std::optional<DType> mu_dtype)
      : b1_(b1),
        b2_(b2),
        eps_(eps),
        eps_root_(eps_root),
        mu_dtype_(state_dtype("scale_by_adam's mu_dtype", mu_dtype)) {}
  const char* name() const override { return "scale_by_adam"; }
  FlatState init(const std::vector<Array>& params, const Sharding& s) const override {
    FlatState st;
    st.scalars.emplace("count", zero_count(s));
    st.slots.emplace("mu", zeros_like(params, mu_dtype_));
    st.slots.emplace("nu", zeros_like(params, std::nullopt));
    return st;
  }
  std::vector<Array> update(std::vector<Array> u, FlatState& st, const std::vector<Array>*,
                            const std::vector<std::string>&) const override {
    std::vector<Array>& mu = st.slots.at("mu");
    std::vector<Array>& nu = st.slots.at("nu");
    Array& count = st.scalars.at("count");
    const Array t = safe_increment(count);
    // tree_bias_correction: 1 - decay ** count, computed once per step (float32), cast to each
    // moment's dtype for the division.
    const Array bc1 = 1.0 - power_of_count(b1_, t);
    const Array bc2 = 1.0 - power_of_count(b2_, t);
    for (size_t k = 0; k < u.size(); ++k) {
      const Array& g = u[k];
      // JAX's promotion: bf16 g with an f32 mu gives an f32 mu; the new moments are cast to the
      // state's dtypes after the update is computed, as optax does.
      const Array new_mu = (1.0 - b1_) * g + b1_ * mu[k];
      const Array new_nu = (1.0 - b2_) * (g * g) + b2_ * nu[k];
      const Array mu_hat = new_mu / cast_to(bc1, new_mu.dtype());
      const Array nu_hat = new_nu / cast_to(bc2, new_nu.dtype());
      // eps_root = 0 adds nothing (nu >= 0), so the op is skipped.
      u[k] = mu_hat / (sqrt(eps_root_ == 0.0 ? nu_hat : nu_hat + eps_root_) + eps_);
      mu[k] = cast_to(new_mu, mu_dtype_);
      nu[k] = cast_to(new_nu, nu[k].dtype());  // optax.tree.cast_like(nu, state.nu)
    }
    count = t;
    return u;
  }

 private:
  double b1_, b2_, eps_, eps_root_;
  std::optional<DType> mu_dtype_;
};

class AddDecayedWeights final : public Transform {
 public:
  explicit AddDecayedWeights(ScalarOrSchedule wd) : wd_(std::move(wd)) {}
  const char* name() const override { return "add_decayed_weights"; }
  FlatState init(const std::vector<Array>&, const Sharding& s) const override {
    FlatState st;
    if (wd_.is_schedule()) st.scalars.emplace("count", zero_count(s));
    return st;
  }
  std::vector<Array> update(std::vector<Array> u, FlatState& st, const std::vector<Array>* params,
                            const std::vector<std::string>&) const override {
    const std::vector<Array>& p = need_params("add_decayed_weights", params);
    if (wd_.is_schedule()) {
      Array& count = st.scalars.at("count");
      const Array s = wd_.schedule()(count);
      // s is a float32 Array (not weak): bf16 params and updates promote to float32, as optax's.
      for (size_t k = 0; k < u.size(); ++k) u[k] = u[k] + s * p[k];
      count = safe_increment(count);
    } else if (wd_.value() != 0.0) {
      for (size_t k = 0; k < u.size(); ++k) u[k] = u[k] + wd_.value() * p[k];
    }
    return u;
  }

 private:
  ScalarOrSchedule wd_;
};

class ClipByGlobalNorm final : public Transform {
 public:
  explicit ClipByGlobalNorm(double max_norm) : max_norm_(max_norm) {}
  const char* name() const override { return "clip_by_global_norm"; }
  FlatState init(const std::vector<Array>&, const Sharding&) const override { return {}; }
  std::vector<Array> update(std::vector<Array> u, FlatState&, const std::vector<Array>*,
                            const std::vector<std::string>&) const override {
    if (u.empty()) return u;
    // optax.tree.norm: sqrt of the sum over leaves (in order) of sum(x * x). Sums of sharded
    // leaves stay pending through the additions: one psum at the sqrt.
    Array sq = sum(u[0] * u[0]);
    for (size_t k = 1; k < u.size(); ++k) sq = sq + sum(u[k] * u[k]);
    const Array g_norm = sqrt(sq);
    const Array trigger = g_norm < max_norm_;
    for (Array& t : u) {
      const Array n = cast_to(g_norm, t.dtype());
      // float16: meshrt's t / n is XLA's product with n's reciprocal rounded to float16 (what
      // XLA's cpu computes for a divisor passed into the computation), but under optax's jit
      // the norm is computed in the same computation and XLA divides: the float32 quotient
      // rounded to float16 (checked against optax 0.2.8 / JAX 0.10.2).
      const Array q = t.dtype() == DType::f16
                          ? astype(astype(t, DType::f32) / astype(n, DType::f32), DType::f16)
                          : t / n;
      t = where(trigger, t, q * max_norm_);
    }
    return u;
  }

 private:
  double max_norm_;
};

GradientTransformation one(detail::TransformPtr t) {
  return GradientTransformation({std::move(t)});
}

}  // namespace

GradientTransformation chain(const std::vector<GradientTransformation>& transforms) {
  std::vector<detail::TransformPtr> all;
  for (const GradientTransformation& t : transforms) {
    all.insert(all.end(), t.transforms().begin(), t.transforms().end());
  }
  return GradientTransformation(std::move(all));
}

GradientTransformation identity() { return one(std::make_shared<Identity>()); }

GradientTransformation scale(double step_size) { return one(std::make_shared<Scale>(step_size)); }

GradientTransformation scale_by_schedule(Schedule schedule) {
  return one(std::make_shared<ScaleBySchedule>(std::move(schedule)));
}

GradientTransformation scale_by_learning_rate(ScalarOrSchedule lr, bool flip_sign) {
  const double m = flip_sign ? -1.0 : 1.0;
  if (!lr.is_schedule()) return scale(m * lr.value());
  Schedule s = lr.schedule();
  if (!flip_sign) return scale_by_schedule(std::move(s));
  return scale_by_schedule(
      Schedule(cat("-", s.name()), [s](const Array& count) { return -s(count); }));
}

GradientTransformation trace(double decay, bool nesterov, std::optional<DType> accumulator_dtype) {
  return one(std::make_shared<Trace>(decay, nesterov, accumulator_dtype));
}

GradientTransformation scale_by_adam(double b1, double b2, double eps, double eps_root,
                                     std::optional<DType> mu_dtype) {
  return one(std::make_shared<ScaleByAdam>(b1, b2, eps, eps_root, mu_dtype));
}

GradientTransformation add_decayed_weights(ScalarOrSchedule weight_decay) {
  return one(std::make_shared<AddDecayedWeights>(std::move(weight_decay)));
}

GradientTransformation clip_by_global_norm(double max_norm) {
  return one(std::make_shared<ClipByGlobalNorm>(max_norm));
}

GradientTransformation sgd(ScalarOrSchedule lr, double momentum, bool nesterov,
                           std::optional<DType> accumulator_dtype) {
  return chain(momentum != 0.0 ? trace(momentum, nesterov, accumulator_dtype) : identity(),
               scale_by_learning_rate(std::move(lr)));
}

GradientTransformation adam(ScalarOrSchedule lr, double b1, double b2, double eps,
                            std::optional<DType> mu_dtype) {
  return chain(scale_by_adam(b1, b2, eps, 0.0, mu_dtype), scale_by_learning_rate(std::move(lr)));
}

GradientTransformation adamw(ScalarOrSchedule lr, double b1, double b2, double eps,
                             ScalarOrSchedule weight_decay, std::optional<DType> mu_dtype) {
  return chain(scale_by_adam(b1, b2, eps, 0.0, mu_dtype),
               add_decayed_weights(std::move(weight_decay)), scale_by_learning_rate(std::move(lr)));
}

}  // namespace meshrt::optim
