// The derivative rules: one table, written once over T (Tensor or Array: the ops share their
// OpIds) and instantiated for both. Each entry names the op (its OpId), what
// the backward pass needs saved, and the vector-Jacobian product, made of ordinary ops (so a
// backward pass is itself recorded when another tape watches it: jvp, grad of grad). Rules
// follow JAX's: maximum/minimum split ties 0.5/0.5 and max/min reductions split them evenly,
// relu'(0) = 0, softmax/log_softmax as jax.nn's custom JVPs, collectives transpose as in
// shard_map (psum -> the cotangent as is, all_gather <-> psum_scatter, ppermute -> the inverse
// permutation, all_to_all -> split and concat swapped). Comparisons, argmax and casts to
// integers give integer or bool outputs, which are never followed: zero gradients, as in JAX.
// pmax and pmin have no rule: JAX defines no derivative for them. Which ops have a rule is the
// Derivative column of the op table (runtime/detail/op_registry.cpp); test_op_registry checks
// that this table agrees with it.
#include <algorithm>
#include <array>
#include <type_traits>
#include <variant>

#include "autodiff/tape.h"
#include "core/error.h"
#include "core/strings.h"
#include "global/array_ops.h"
#include "runtime/tensor_ops.h"

namespace meshrt::autodiff {

using detail::cat;
using detail::OpId;

Tensor zeros_of(const Meta<Tensor>& m) { return zeros(m.shape, m.dtype, m.device); }
Array zeros_of(const Meta<Array>& m) { return zeros(m.shape, m.dtype, m.sharding); }

Tensor scalar_next_to(const Tensor& x, double v) { return full({}, v, x.dtype(), x.device()); }
Array scalar_next_to(const Array& x, double v) {
  const std::optional<NamedSharding> named = x.sharding().as_named();
  if (!named) return full({}, v, x.dtype(), x.sharding());
  return full({}, v, x.dtype(), NamedSharding(named->mesh(), P()));
}

template <class T>
T fit(T ct, const Meta<T>& m) {
  const size_t rank = m.shape.size();
  while (ct.shape().size() > rank) ct = sum(ct, 0);
  for (size_t d = 0; d < rank; ++d) {
    if (m.shape[d] == 1 && ct.shape()[d] != 1) ct = sum(ct, static_cast<int>(d), true);
  }
  if (ct.dtype() != m.dtype) ct = astype(ct, m.dtype);
  return ct;
}
template Tensor fit(Tensor, const Meta<Tensor>&);
template Array fit(Array, const Meta<Array>&);

namespace {

// The node's attributes, of the kind its op carries.
template <class A, class T>
const A& attrs_of(const Node<T>& n) {
  return std::get<A>(n.attrs);
}

template <class T>
const T& ct_of(const CtList<T>& cts, size_t k) {
  return *cts[k];  // run_node only calls a one-output rule with its cotangent
}

template <class T>
T bool_as(const T& mask, DType dt) {
  return astype(mask, dt);
}

Tensor zeros_as(const Meta<Tensor>& m, DType dt) { return zeros(m.shape, dt, m.device); }
Array zeros_as(const Meta<Array>& m, DType dt) { return zeros(m.shape, dt, m.sharding); }

// ct of a reduction (shape of its output) expanded back to the input's rank and broadcast.
template <class T>
T unreduce(T ct, const Meta<T>& in, const std::optional<int>& axis, bool keepdims) {
  const auto rank = static_cast<int>(in.shape.size());
  if (!keepdims) {
    if (axis) {
      ct = expand_dims(ct, *axis < 0 ? *axis + rank : *axis);
    } else {
      ct = reshape(ct, Shape(in.shape.size(), 1));
    }
  }
  if (ct.shape() == in.shape) return ct;
  return add(zeros_as(in, ct.dtype()), ct);
}

// The cotangent of slice(x, start, limit, strides): ct scattered back into x's shape.
template <class T>
T unslice(T ct, const Meta<T>& in, const Shape& start, const Shape& limit, const Shape& strides) {
  std::vector<std::pair<int64_t, int64_t>> widths;
  for (size_t d = 0; d < in.shape.size(); ++d) {
    const auto ax = static_cast<int>(d);
    if (strides[d] > 1) {  // put stride-1 zeros after every element, then trim
      Shape merged = ct.shape();
      merged[d] *= strides[d];
      std::vector<std::pair<int64_t, int64_t>> spread(ct.shape().size() + 1, {0, 0});
      spread[d + 1] = {0, strides[d] - 1};
      ct = reshape(pad(expand_dims(ct, ax + 1), spread), merged);
      ct = slice_in_dim(ct, 0, limit[d] - start[d], 1, ax);
    }
    widths.emplace_back(start[d], in.shape[d] - start[d] - ct.shape()[d]);
  }
  for (const auto& w : widths) {
    if (w.first != 0 || w.second != 0) return pad(ct, widths);
  }
  return ct;
}

Context& ctx_of(Env& env, std::string_view op) {
  if (env.ctx == nullptr) {
    throw Error(cat("[autodiff] ", op, " outside a shard_map body cannot be transposed"));
  }
  return *env.ctx;
}

template <class T>
using Vjp = CtList<T> (*)(const Node<T>&, const CtList<T>&, Env&);

// maximum / minimum as JAX's _balanced_eq: the winner gets the cotangent, a tie splits it
// 0.5 / 0.5 (the scalar form: between the input and attrs.value).
template <class T, bool kMax, class B>
T share(const T& g, const T& x, const B& y) {
  const DType dt = g.dtype();
  const T wins = bool_as(kMax ? greater(x, y) : less(x, y), dt);
  return multiply(g, add(wins, multiply(bool_as(equal(x, y), dt), 0.5)));
}
template <class T, bool kMax>
CtList<T> balanced(const Node<T>& n, const CtList<T>& c, Env&) {
  return {share<T, kMax>(ct_of(c, 0), n.input(0), n.input(1)),
          share<T, kMax>(ct_of(c, 0), n.input(1), n.input(0))};
}
template <class T, bool kMax>
CtList<T> balanced_scalar(const Node<T>& n, const CtList<T>& c, Env&) {
  return {share<T, kMax>(ct_of(c, 0), n.input(0), Scalar(attrs_of<detail::ScalarAttrs>(n).value))};
}

// C = op(A) @ op(B) with jnp.matmul's 1-D promotion and batch broadcasting undone, op
// transposing where asked (MatmulAttrs): each stored operand's cotangent is one product of the
// other operand and G, read transposed as needed, so no transpose is ever copied
// (dot_general's swapped dims).
template <class T>
CtList<T> matmul_vjp(const Node<T>& n, const CtList<T>& c, Env&) {
  const auto& at = attrs_of<detail::MatmulAttrs>(n);
  const bool ta = at.transpose_a, tb = at.transpose_b;
  // The forward product's precision, as JAX's dot_general transpose keeps it.
  const Precision p = at.precision;
  const auto opts = [p] {
    if constexpr (std::is_same_v<T, Array>) {
      return OpOptions{.out_sharding = std::nullopt, .precision = p};
    } else {
      return MatmulOptions{p};
    }
  }();
  const auto matmul_transposed = [&opts](const T& x, const T& y, bool tx, bool ty) {
    return meshrt::matmul_transposed(x, y, tx, ty, opts);
  };
  T a = n.input(0);
  T b = n.input(1);
  T g = ct_of(c, 0);
  const bool a_vec = a.shape().size() == 1, b_vec = b.shape().size() == 1;
  if (a_vec) a = reshape(a, {1, a.shape()[0]});
  if (b_vec) b = reshape(b, {b.shape()[0], 1});
  if (b_vec) g = expand_dims(g, static_cast<int>(g.shape().size()));
  if (a_vec) g = expand_dims(g, static_cast<int>(g.shape().size()) - 1);
  CtList<T> r(2);
  if (n.in[0] != 0) {
    T ga = ta ? matmul_transposed(b, g, tb, true) : matmul_transposed(g, b, false, !tb);
    if (a_vec) ga = squeeze(ga, {static_cast<int>(ga.shape().size()) - 2});
    r[0] = ga;
  }
  if (n.in[1] != 0) {
    T gb = tb ? matmul_transposed(g, a, true, ta) : matmul_transposed(a, g, !ta, false);
    if (b_vec) gb = squeeze(gb, {static_cast<int>(gb.shape().size()) - 1});
    r[1] = gb;
  }
  return r;
}

template <class T>
std::array<Rule<T>, detail::kOpCount> make_table() {
  constexpr bool kArray = std::is_same_v<T, Array>;
  std::array<Rule<T>, detail::kOpCount> t{};
  auto add_rule = [&t](OpId op, unsigned saves, bool out, Vjp<T> f) {
    t[static_cast<size_t>(op)] = Rule<T>{op, saves, out, f};
  };
  constexpr unsigned kNone = 0, kIn0 = 1, kIn01 = 3;  // bit i: input i is saved

  // ---- elementwise (run_node unbroadcasts and casts each cotangent to its input)
  add_rule(OpId::add, kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {ct_of(c, 0), ct_of(c, 0)};
  });
  add_rule(OpId::subtract, kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {ct_of(c, 0), neg(ct_of(c, 0))};
  });
  add_rule(OpId::multiply, kIn01, false,
           [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
             const T& g = ct_of(c, 0);
             CtList<T> r(2);
             if (n.in[0] != 0) r[0] = multiply(g, n.input(1));
             if (n.in[1] != 0) r[1] = multiply(n.input(0), g);
             return r;
           });
  add_rule(OpId::divide, kIn01, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& g = ct_of(c, 0);
    CtList<T> r(2);
    if (n.in[0] != 0) r[0] = divide(g, n.input(1));
    if (n.in[1] != 0)  // -g * x / y^2
      r[1] = divide(multiply(neg(g), n.input(0)), multiply(n.input(1), n.input(1)));
    return r;
  });
  add_rule(OpId::maximum, kIn01, false, &balanced<T, true>);
  add_rule(OpId::minimum, kIn01, false, &balanced<T, false>);
  add_rule(OpId::where, kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& g = ct_of(c, 0);
    const T zero = scalar_next_to(g, 0.0);
    return {std::nullopt, where(n.input(0), g, zero), where(n.input(0), zero, g)};
  });
  add_rule(OpId::neg, kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {neg(ct_of(c, 0))};
  });
  add_rule(OpId::exp, kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {multiply(ct_of(c, 0), n.output())};
  });
  add_rule(OpId::log, kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {divide(ct_of(c, 0), n.input(0))};
  });
  add_rule(OpId::sin, kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {multiply(ct_of(c, 0), cos(n.input(0)))};
  });
  add_rule(OpId::cos, kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {multiply(ct_of(c, 0), neg(sin(n.input(0))))};
  });
  add_rule(OpId::tanh, kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& y = n.output();  // g * (1 + y) * (1 - y), as JAX
    return {multiply(multiply(ct_of(c, 0), add(y, 1.0)), subtract(1.0, y))};
  });
  add_rule(OpId::sqrt, kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {multiply(ct_of(c, 0), divide(0.5, n.output()))};
  });
  add_rule(OpId::relu, kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& g = ct_of(c, 0);
    return {where(greater(n.output(), 0.0), g, scalar_next_to(g, 0.0))};
  });
  // ---- with a scalar (attrs.value)
  add_rule(OpId::add_scalar, kNone, false,
           [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> { return {ct_of(c, 0)}; });
  add_rule(OpId::sub_scalar, kNone, false,
           [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> { return {ct_of(c, 0)}; });
  add_rule(
      OpId::rsub_scalar, kNone, false,
      [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> { return {neg(ct_of(c, 0))}; });
  add_rule(OpId::mul_scalar, kNone, false,
           [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
             return {multiply(ct_of(c, 0), attrs_of<detail::ScalarAttrs>(n).value)};
           });
  add_rule(OpId::div_scalar, kNone, false,
           [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
             return {divide(ct_of(c, 0), attrs_of<detail::ScalarAttrs>(n).value)};
           });
  add_rule(
      OpId::rdiv_scalar, kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
        const T& x = n.input(0);  // d(s / x) = -s / x^2
        return {
            divide(multiply(ct_of(c, 0), -attrs_of<detail::ScalarAttrs>(n).value), multiply(x, x))};
      });
  add_rule(OpId::max_scalar, kIn0, false, &balanced_scalar<T, true>);
  add_rule(OpId::min_scalar, kIn0, false, &balanced_scalar<T, false>);
  add_rule(OpId::identity, kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {ct_of(c, 0)};  // a differentiated input as an inner tape's leaf
  });
  add_rule(OpId::astype, kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {ct_of(c, 0)};  // run_node casts it back to the input's dtype
  });

  // ---- reductions
  add_rule(OpId::sum, kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const auto& a = attrs_of<detail::ReduceAttrs>(n);
    return {unreduce(ct_of(c, 0), n.in_meta[0], a.axis, a.keepdims)};
  });
  add_rule(OpId::mean, kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const auto& at = attrs_of<detail::ReduceAttrs>(n);
    const Shape& s = n.in_meta[0].shape;
    int64_t count = shape_size(s);
    if (at.axis) {
      const int a = *at.axis < 0 ? *at.axis + static_cast<int>(s.size()) : *at.axis;
      count = s[static_cast<size_t>(a)];
    }
    return {divide(unreduce(ct_of(c, 0), n.in_meta[0], at.axis, at.keepdims),
                   static_cast<double>(count))};
  });
  // max/min: the cotangent split evenly among the positions that attain the extremum.
  auto extremum = [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const auto& a = attrs_of<detail::ReduceAttrs>(n);
    const T& x = n.input(0);
    const DType dt = ct_of(c, 0).dtype();
    const T at = bool_as(equal(x, unreduce(n.output(), n.in_meta[0], a.axis, a.keepdims)), dt);
    const T count = sum(at, a.axis, true);
    const T g = unreduce(ct_of(c, 0), n.in_meta[0], a.axis, a.keepdims);
    return {divide(multiply(g, at), count)};
  };
  add_rule(OpId::max, kIn0, true, extremum);
  add_rule(OpId::min, kIn0, true, extremum);
  add_rule(OpId::softmax, kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& y = n.output();
    const T& g = ct_of(c, 0);
    return {
        multiply(y, subtract(g, sum(multiply(g, y), attrs_of<detail::AxisAttrs>(n).axis, true)))};
  });
  add_rule(OpId::log_softmax, kNone, true,
           [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
             const T& g = ct_of(c, 0);
             return {subtract(
                 g, multiply(exp(n.output()), sum(g, attrs_of<detail::AxisAttrs>(n).axis, true)))};
           });

  // ---- linear algebra
  add_rule(OpId::matmul, kIn01, false, matmul_vjp<T>);
  add_rule(OpId::matmul_transposed, kIn01, false, matmul_vjp<T>);

  // ---- shape
  add_rule(OpId::transpose, kNone, false,
           [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
             const std::vector<int64_t>& perm = attrs_of<detail::PermAttrs>(n).perm;
             std::vector<int> inverse(perm.size());
             for (size_t i = 0; i < perm.size(); ++i)
               inverse[static_cast<size_t>(perm[i])] = static_cast<int>(i);
             return {transpose(ct_of(c, 0), inverse)};
           });
  add_rule(OpId::reshape, kNone, false,
           [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
             return {reshape(ct_of(c, 0), n.in_meta[0].shape)};
           });
  add_rule(OpId::slice, kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const auto& a = attrs_of<detail::SliceAttrs>(n);
    return {unslice(ct_of(c, 0), n.in_meta[0], a.start, a.limit, a.strides)};
  });
  add_rule(OpId::pad, kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const auto& widths = attrs_of<detail::PadAttrs>(n).widths;
    Shape start, limit;
    for (size_t d = 0; d < widths.size(); ++d) {
      start.push_back(widths[d].first);
      limit.push_back(widths[d].first + n.in_meta[0].shape[d]);
    }
    return {slice(ct_of(c, 0), start, limit)};
  });
  add_rule(OpId::concatenate, kNone, false,
           [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
             const int ax = attrs_of<detail::AxisAttrs>(n).axis;
             CtList<T> r;
             int64_t at = 0;
             for (const auto& m : n.in_meta) {
               const int64_t len = m.shape[static_cast<size_t>(ax)];
               r.push_back(slice_in_dim(ct_of(c, 0), at, at + len, 1, ax));
               at += len;
             }
             return r;
           });
  if constexpr (kArray) {
    add_rule(
        OpId::stack, kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
          const int ax = attrs_of<detail::AxisAttrs>(n).axis;
          CtList<T> r;
          for (size_t i = 0; i < n.in_meta.size(); ++i) {
            const auto at = static_cast<int64_t>(i);
            r.push_back(reshape(slice_in_dim(ct_of(c, 0), at, at + 1, 1, ax), n.in_meta[i].shape));
          }
          return r;
        });
    add_rule(OpId::split, kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
               std::vector<T> parts;
               for (size_t k = 0; k < n.out_meta.size(); ++k)
                 parts.push_back(c[k] ? *c[k] : zeros_of(n.out_meta[k]));
               return {concatenate(parts, attrs_of<detail::AxisAttrs>(n).axis)};
             });
    add_rule(OpId::with_sharding_constraint, kNone, false,
             [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> { return {ct_of(c, 0)}; });
    add_rule(OpId::device_put, kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
               return {device_put(ct_of(c, 0), n.in_meta[0].sharding)};
             });
  } else {
    add_rule(OpId::row, kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
      const Shape& s = n.in_meta[0].shape;
      std::vector<std::pair<int64_t, int64_t>> widths(s.size(), {0, 0});
      const int64_t i = attrs_of<detail::RowAttrs>(n).index;
      widths[0] = {i, s[0] - 1 - i};
      return {pad(expand_dims(ct_of(c, 0), 0), widths)};
    });
    add_rule(OpId::dynamic_update_slice, kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
               const T& g = ct_of(c, 0);
               const Shape& us = n.in_meta[1].shape;
               const Shape& starts = attrs_of<detail::UpdateSliceAttrs>(n).starts;
               Shape limit = starts;
               for (size_t d = 0; d < limit.size(); ++d) limit[d] += us[d];
               return {dynamic_update_slice(g, meshrt::zeros(us, g.dtype(), g.device()), starts),
                       slice(g, starts, limit)};
             });
    // ---- collectives (in shard_map bodies; env.ctx is the transposing body's Context)
    add_rule(OpId::psum, kNone, false,
             [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> { return {ct_of(c, 0)}; });
    add_rule(
        OpId::pmean, kNone, false, [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
          const int64_t size =
              ctx_of(e, "pmean").axis_size(AxisNames(attrs_of<detail::CollectiveAttrs>(n).axes));
          return {divide(ct_of(c, 0), static_cast<double>(size))};
        });
    add_rule(OpId::all_gather, kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
               const auto& a = attrs_of<detail::GatherAttrs>(n);
               return {ctx_of(e, "all_gather")
                           .psum_scatter(ct_of(c, 0), AxisNames(a.axes), a.axis, a.tiled)};
             });
    add_rule(OpId::psum_scatter, kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
               const auto& a = attrs_of<detail::GatherAttrs>(n);
               return {ctx_of(e, "psum_scatter")
                           .all_gather(ct_of(c, 0), AxisNames(a.axes), a.axis, a.tiled)};
             });
    add_rule(OpId::ppermute, kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
               const auto& a = attrs_of<detail::PpermuteAttrs>(n);
               std::vector<std::pair<int64_t, int64_t>> inverse;
               for (const auto& [src, dst] : a.perm) inverse.emplace_back(dst, src);
               return {ctx_of(e, "ppermute").ppermute(ct_of(c, 0), AxisNames(a.axes), inverse)};
             });
    add_rule(OpId::all_to_all, kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
               const auto& a = attrs_of<detail::AllToAllAttrs>(n);
               return {ctx_of(e, "all_to_all")
                           .all_to_all(ct_of(c, 0), AxisNames(a.axes), a.concat_axis, a.split_axis,
                                       a.tiled)};
             });
  }
  return t;
}

}  // namespace

template <class T>
const Rule<T>* find_rule(OpId op) {
  static const std::array<Rule<T>, detail::kOpCount> table = make_table<T>();
  const Rule<T>& r = table[static_cast<size_t>(op)];
  return r.vjp == nullptr ? nullptr : &r;
}
template const Rule<Tensor>* find_rule<Tensor>(OpId);
template const Rule<Array>* find_rule<Array>(OpId);

}  // namespace meshrt::autodiff
