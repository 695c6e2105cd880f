// The derivative rules: one table, written once over T (Tensor or Array: the ops share their
// names) and instantiated for both. Each entry names the op as the op dispatch reports it, what
// the backward pass needs saved, and the vector-Jacobian product, made of ordinary ops (so a
// backward pass is itself recorded when another tape watches it: jvp, grad of grad). Rules
// follow JAX's: maximum/minimum split ties 0.5/0.5 and max/min reductions split them evenly,
// relu'(0) = 0, softmax/log_softmax as jax.nn's custom JVPs, collectives transpose as in
// shard_map (psum -> the cotangent as is, all_gather <-> psum_scatter, ppermute -> the inverse
// permutation, all_to_all -> split and concat swapped). Comparisons, argmax and casts to
// integers give integer or bool outputs, which are never followed: zero gradients, as in JAX.
// pmax and pmin have no rule: JAX defines no derivative for them.
#include <algorithm>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "autodiff/tape.h"
#include "core/error.h"
#include "core/strings.h"
#include "global/array_ops.h"
#include "runtime/tensor_ops.h"

namespace meshrt::autodiff {

using detail::cat;

Tensor zeros_of(const Meta<Tensor>& m) { return zeros(m.shape, m.dtype, m.device); }
Array zeros_of(const Meta<Array>& m) { return zeros(m.shape, m.dtype, m.sharding); }

Tensor scalar_next_to(const Tensor& x, double v) { return full({}, v, x.dtype(), x.device()); }
Array scalar_next_to(const Array& x, double v) {
  const Mesh* mesh = x.sharding().mesh_or_null();
  if (mesh == nullptr) return full({}, v, x.dtype(), x.sharding());
  return full({}, v, x.dtype(), NamedSharding(*mesh, P()));
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
  return {share<T, kMax>(ct_of(c, 0), n.input(0), Scalar(n.attrs.value))};
}

// C = op(A) @ op(B) with jnp.matmul's 1-D promotion and batch broadcasting undone, op
// transposing where asked (matmul: neither; matmul_transposed, kAttrs: ints = {ta, tb}): each
// stored operand's cotangent is one product of the other operand and G, read transposed as
// needed, so no transpose is ever copied (dot_general's swapped dims).
template <class T, bool kAttrs>
CtList<T> matmul_vjp(const Node<T>& n, const CtList<T>& c, Env&) {
  const bool ta = kAttrs && n.attrs.ints.at(0) != 0, tb = kAttrs && n.attrs.ints.at(1) != 0;
  // The forward product's precision (ints[2]), as JAX's dot_general transpose keeps it.
  const Precision p =
      n.attrs.ints.size() > 2 ? static_cast<Precision>(n.attrs.ints[2]) : Precision::highest;
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
std::unordered_map<std::string_view, Rule<T>> make_table() {
  constexpr bool kArray = std::is_same_v<T, Array>;
  std::unordered_map<std::string_view, Rule<T>> t;
  auto add_rule = [&t](std::string_view op, unsigned saves, bool out, Vjp<T> f) {
    t.emplace(op, Rule<T>{op, saves, out, f});
  };
  constexpr unsigned kNone = 0, kIn0 = 1, kIn01 = 3;  // bit i: input i is saved

  // ---- elementwise (run_node unbroadcasts and casts each cotangent to its input)
  add_rule("add", kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {ct_of(c, 0), ct_of(c, 0)};
  });
  add_rule("subtract", kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {ct_of(c, 0), neg(ct_of(c, 0))};
  });
  add_rule("multiply", kIn01, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& g = ct_of(c, 0);
    CtList<T> r(2);
    if (n.in[0] != 0) r[0] = multiply(g, n.input(1));
    if (n.in[1] != 0) r[1] = multiply(n.input(0), g);
    return r;
  });
  add_rule("divide", kIn01, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& g = ct_of(c, 0);
    CtList<T> r(2);
    if (n.in[0] != 0) r[0] = divide(g, n.input(1));
    if (n.in[1] != 0)  // -g * x / y^2
      r[1] = divide(multiply(neg(g), n.input(0)), multiply(n.input(1), n.input(1)));
    return r;
  });
  add_rule("maximum", kIn01, false, &balanced<T, true>);
  add_rule("minimum", kIn01, false, &balanced<T, false>);
  add_rule("where", kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& g = ct_of(c, 0);
    const T zero = scalar_next_to(g, 0.0);
    return {std::nullopt, where(n.input(0), g, zero), where(n.input(0), zero, g)};
  });
  add_rule("neg", kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {neg(ct_of(c, 0))};
  });
  add_rule("exp", kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {multiply(ct_of(c, 0), n.output())};
  });
  add_rule("log", kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {divide(ct_of(c, 0), n.input(0))};
  });
  add_rule("sin", kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {multiply(ct_of(c, 0), cos(n.input(0)))};
  });
  add_rule("cos", kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {multiply(ct_of(c, 0), neg(sin(n.input(0))))};
  });
  add_rule("tanh", kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& y = n.output();  // g * (1 + y) * (1 - y), as JAX
    return {multiply(multiply(ct_of(c, 0), add(y, 1.0)), subtract(1.0, y))};
  });
  add_rule("sqrt", kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {multiply(ct_of(c, 0), divide(0.5, n.output()))};
  });
  add_rule("relu", kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& g = ct_of(c, 0);
    return {where(greater(n.output(), 0.0), g, scalar_next_to(g, 0.0))};
  });
  // ---- with a scalar (attrs.value)
  add_rule("add_scalar", kNone, false,
           [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> { return {ct_of(c, 0)}; });
  add_rule("sub_scalar", kNone, false,
           [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> { return {ct_of(c, 0)}; });
  add_rule("rsub_scalar", kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {neg(ct_of(c, 0))};
  });
  add_rule("mul_scalar", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {multiply(ct_of(c, 0), n.attrs.value)};
  });
  add_rule("div_scalar", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {divide(ct_of(c, 0), n.attrs.value)};
  });
  add_rule("rdiv_scalar", kIn0, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& x = n.input(0);  // d(s / x) = -s / x^2
    return {divide(multiply(ct_of(c, 0), -n.attrs.value), multiply(x, x))};
  });
  add_rule("max_scalar", kIn0, false, &balanced_scalar<T, true>);
  add_rule("min_scalar", kIn0, false, &balanced_scalar<T, false>);
  add_rule("identity", kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {ct_of(c, 0)};  // a differentiated input as an inner tape's leaf
  });
  add_rule("astype", kNone, false, [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> {
    return {ct_of(c, 0)};  // run_node casts it back to the input's dtype
  });

  // ---- reductions
  add_rule("sum", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {unreduce(ct_of(c, 0), n.in_meta[0], n.attrs.axis, n.attrs.keepdims)};
  });
  add_rule("mean", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const Shape& s = n.in_meta[0].shape;
    int64_t count = shape_size(s);
    if (n.attrs.axis) {
      const int a = *n.attrs.axis < 0 ? *n.attrs.axis + static_cast<int>(s.size()) : *n.attrs.axis;
      count = s[static_cast<size_t>(a)];
    }
    return {divide(unreduce(ct_of(c, 0), n.in_meta[0], n.attrs.axis, n.attrs.keepdims),
                   static_cast<double>(count))};
  });
  // max/min: the cotangent split evenly among the positions that attain the extremum.
  auto extremum = [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& x = n.input(0);
    const DType dt = ct_of(c, 0).dtype();
    const T at =
        bool_as(equal(x, unreduce(n.output(), n.in_meta[0], n.attrs.axis, n.attrs.keepdims)), dt);
    const T count = sum(at, n.attrs.axis, true);
    const T g = unreduce(ct_of(c, 0), n.in_meta[0], n.attrs.axis, n.attrs.keepdims);
    return {divide(multiply(g, at), count)};
  };
  add_rule("max", kIn0, true, extremum);
  add_rule("min", kIn0, true, extremum);
  add_rule("softmax", kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& y = n.output();
    const T& g = ct_of(c, 0);
    return {multiply(y, subtract(g, sum(multiply(g, y), n.attrs.axis, true)))};
  });
  add_rule("log_softmax", kNone, true, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    const T& g = ct_of(c, 0);
    return {subtract(g, multiply(exp(n.output()), sum(g, n.attrs.axis, true)))};
  });

  // ---- linear algebra
  add_rule("matmul", kIn01, false, matmul_vjp<T, false>);
  add_rule("matmul_transposed", kIn01, false, matmul_vjp<T, true>);

  // ---- shape
  add_rule("transpose", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    std::vector<int> inverse(n.attrs.ints.size());
    for (size_t i = 0; i < n.attrs.ints.size(); ++i)
      inverse[static_cast<size_t>(n.attrs.ints[i])] = static_cast<int>(i);
    return {transpose(ct_of(c, 0), inverse)};
  });
  add_rule("reshape", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {reshape(ct_of(c, 0), n.in_meta[0].shape)};
  });
  add_rule("slice", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    return {unslice(ct_of(c, 0), n.in_meta[0], n.attrs.ints, n.attrs.ints2, n.attrs.ints3)};
  });
  add_rule("pad", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
    Shape start, limit;
    for (size_t d = 0; d < n.attrs.pairs.size(); ++d) {
      start.push_back(n.attrs.pairs[d].first);
      limit.push_back(n.attrs.pairs[d].first + n.in_meta[0].shape[d]);
    }
    return {slice(ct_of(c, 0), start, limit)};
  });
  add_rule("concatenate", kNone, false,
           [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
             const int ax = *n.attrs.axis;
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
    add_rule("stack", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
      const int ax = *n.attrs.axis;
      CtList<T> r;
      for (size_t i = 0; i < n.in_meta.size(); ++i) {
        const auto at = static_cast<int64_t>(i);
        r.push_back(reshape(slice_in_dim(ct_of(c, 0), at, at + 1, 1, ax), n.in_meta[i].shape));
      }
      return r;
    });
    add_rule("split", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
      std::vector<T> parts;
      for (size_t k = 0; k < n.out_meta.size(); ++k)
        parts.push_back(c[k] ? *c[k] : zeros_of(n.out_meta[k]));
      return {concatenate(parts, *n.attrs.axis)};
    });
    add_rule("with_sharding_constraint", kNone, false,
             [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> { return {ct_of(c, 0)}; });
    add_rule("device_put", kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
               return {device_put(ct_of(c, 0), n.in_meta[0].sharding)};
             });
  } else {
    add_rule("row", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
      const Shape& s = n.in_meta[0].shape;
      std::vector<std::pair<int64_t, int64_t>> widths(s.size(), {0, 0});
      widths[0] = {n.attrs.ints[0], s[0] - 1 - n.attrs.ints[0]};
      return {pad(expand_dims(ct_of(c, 0), 0), widths)};
    });
    add_rule("dynamic_update_slice", kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env&) -> CtList<T> {
               const T& g = ct_of(c, 0);
               const Shape& us = n.in_meta[1].shape;
               Shape limit = n.attrs.ints;
               for (size_t d = 0; d < limit.size(); ++d) limit[d] += us[d];
               return {
                   dynamic_update_slice(g, meshrt::zeros(us, g.dtype(), g.device()), n.attrs.ints),
                   slice(g, n.attrs.ints, limit)};
             });
    // ---- collectives (in shard_map bodies; env.ctx is the transposing body's Context)
    add_rule("psum", kNone, false,
             [](const Node<T>&, const CtList<T>& c, Env&) -> CtList<T> { return {ct_of(c, 0)}; });
    add_rule("pmean", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
      const int64_t size = ctx_of(e, "pmean").axis_size(AxisNames(n.attrs.axes));
      return {divide(ct_of(c, 0), static_cast<double>(size))};
    });
    add_rule(
        "all_gather", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
          return {
              ctx_of(e, "all_gather")
                  .psum_scatter(ct_of(c, 0), AxisNames(n.attrs.axes), n.attrs.a, n.attrs.keepdims)};
        });
    add_rule("psum_scatter", kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
               return {ctx_of(e, "psum_scatter")
                           .all_gather(ct_of(c, 0), AxisNames(n.attrs.axes), n.attrs.a,
                                       n.attrs.keepdims)};
             });
    add_rule(
        "ppermute", kNone, false, [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
          std::vector<std::pair<int64_t, int64_t>> inverse;
          for (const auto& [src, dst] : n.attrs.pairs) inverse.emplace_back(dst, src);
          return {ctx_of(e, "ppermute").ppermute(ct_of(c, 0), AxisNames(n.attrs.axes), inverse)};
        });
    add_rule("all_to_all", kNone, false,
             [](const Node<T>& n, const CtList<T>& c, Env& e) -> CtList<T> {
               return {ctx_of(e, "all_to_all")
                           .all_to_all(ct_of(c, 0), AxisNames(n.attrs.axes), n.attrs.b, n.attrs.a,
                                       n.attrs.keepdims)};
             });
  }
  return t;
}

}  // namespace

template <class T>
const Rule<T>* find_rule(std::string_view op) {
  static const std::unordered_map<std::string_view, Rule<T>> table = make_table<T>();
  auto it = table.find(op);
  return it == table.end() ? nullptr : &it->second;
}
template const Rule<Tensor>* find_rule<Tensor>(std::string_view);
template const Rule<Array>* find_rule<Array>(std::string_view);

}  // namespace meshrt::autodiff
