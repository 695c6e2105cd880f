// The public entry points' side (autodiff.h): stop_gradient, and Differentiation, the tape behind
// value_and_grad, grad, vjp and jvp.
#include "autodiff/autodiff.h"

#include <memory>

#include "autodiff/tape.h"
#include "core/error.h"
#include "core/strings.h"
#include "global/array_ops.h"
#include "runtime/detail/access.h"
#include "runtime/tensor_ops.h"

// ---- the public entry points' side (autodiff.h)
namespace meshrt {

using detail::cat;

Tensor stop_gradient(const Tensor& x) {
  Tensor y = x;
  detail::set_trace_id(y, 0);
  return y;
}
Array stop_gradient(const Array& x) {
  Array y = x;
  detail::set_trace_id(y, 0);
  return y;
}

namespace autodiff_detail {

struct Differentiation::Seeds {
  std::vector<std::pair<uint64_t, Tensor>> tensors;
  std::vector<std::pair<uint64_t, Array>> arrays;
};
struct Differentiation::Active {
  explicit Active(autodiff::Tape& t) : on(t) {}
  detail::TraceScope on;
};

Differentiation::Differentiation()
    : tape_(std::make_unique<autodiff::Tape>()), seeds_(std::make_unique<Seeds>()) {}
Differentiation::Differentiation(Differentiation&&) noexcept = default;
Differentiation& Differentiation::operator=(Differentiation&&) noexcept = default;
Differentiation::~Differentiation() = default;

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
  if (detail::trace_id(x) == 0 || !detail::tracing()) return false;
  detail::Traced<T> tr(detail::OpId::identity, {&x});
  x = tr(T(x));
  return detail::trace_id(x) != 0;
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

void Differentiation::watch(Tensor& x, const std::string& path, const char* api) {
  watch_leaf(*tape_, x, path, api);
}
void Differentiation::watch(Array& x, const std::string& path, const char* api) {
  watch_leaf(*tape_, x, path, api);
}
Differentiation::Scope::Scope(Differentiation& d) : d_(d) {
  d_.active_ = std::make_unique<Active>(*d_.tape_);
}
Differentiation::Scope::~Scope() { d_.active_.reset(); }

namespace {
[[noreturn]] void throw_used() {
  throw Error(
      "[autodiff] this pullback already ran and its tape was freed: a pullback runs once; call "
      "vjp again for another cotangent");
}
}  // namespace

void Differentiation::seed(const Tensor& out, const Tensor& ct) {
  if (tape_->used()) throw_used();
  seeds_->tensors.emplace_back(detail::trace_id(out), ct);
}
void Differentiation::seed(const Array& out, const Array& ct) {
  if (tape_->used()) throw_used();
  seeds_->arrays.emplace_back(detail::trace_id(out), ct);
}
void Differentiation::backward() {
  autodiff::Env env;
  tape_->backward(std::move(seeds_->tensors), std::move(seeds_->arrays), env);
  seeds_->tensors.clear();
  seeds_->arrays.clear();
}

Tensor Differentiation::grad(const Tensor& leaf, const std::string&) {
  std::optional<Tensor> g = tape_->tensor_grad(detail::trace_id(leaf));
  if (!g) return zeros(leaf.shape(), leaf.dtype(), leaf.device());
  return autodiff::fit(*g, autodiff::Meta<Tensor>::of(leaf));
}

Array Differentiation::grad(const Array& leaf, const std::string& path) {
  std::optional<Array> g = tape_->array_grad(detail::trace_id(leaf));
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
