// autodiff/autodiff.h: gradients of programs written with Arrays, Tensors and shard_map.
//
//   struct Params { Array w1, w2; };
//   MESHRT_TREE(Params, w1, w2);
//   auto loss = [](const Params& p, const Array& x, const Array& y) { return mean(...); };
//   auto [l, grads] = value_and_grad(loss)(params, x, y);     // grads: Params, sharded like params
//   auto [l2, gs] = value_and_grad<0, 1>(loss)(params, x, y);  // gs: std::tuple<Params, Array>
//   auto g = grad(loss)(params, x, y);
//   auto [out, pullback] = vjp(f, a, b);  auto [ga, gb] = pullback(ct);
//   auto [out2, tangent] = jvp(f, std::make_tuple(a, b), std::make_tuple(ta, tb));
//
// Reverse mode records the ops that ran on the differentiated inputs (autodiff/tape.h) and walks
// them back once; every Array op, every Tensor op, and shard_map (bodies and collectives, which
// transpose as in JAX) are differentiable. A gradient has its primal's sharding and dtype; the
// backward pass inserts only the collectives it needs (they show in the CollectiveLog). Integer
// and bool values are never differentiated (comparisons, argmax, casts to integers give zero
// gradients, as in JAX). Reading a differentiated value on the host inside the function
// (to_vector, addressable_shards) is an Error: read after the call, or use stop_gradient.
// jvp is computed as the transpose of the vjp (two backward passes), so it costs about twice a
// gradient.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "global/array_ops.h"
#include "runtime/array.h"
#include "runtime/tensor.h"
#include "runtime/tree.h"

namespace meshrt {

namespace autodiff {
class Tape;
}  // namespace autodiff

// The value of `x`, cut from the computation: no gradient flows through it (lax.stop_gradient).
Tensor stop_gradient(const Tensor& x);
// The same for an Array: its value, with no gradient flowing through it.
Array stop_gradient(const Array& x);

namespace autodiff_detail {

// One differentiation (value_and_grad, grad, vjp): the inputs it follows, the ops that ran on
// them (its tape), one backward pass. (Not CollectiveLog::Recording, which lists collectives.)
class Differentiation {
 public:
  Differentiation();
  Differentiation(Differentiation&&) noexcept;
  Differentiation& operator=(Differentiation&&) noexcept;
  ~Differentiation();

  // Follows this copy of an input (`path` names it in errors); integer inputs are an Error
  // naming `api` and the path.
  void watch(Tensor& x, const std::string& path, const char* api);
  void watch(Array& x, const std::string& path, const char* api);
  // Records the ops run on this thread while it lives (the tape's TraceScope), exceptions
  // included.
  class Scope {
   public:
    explicit Scope(Differentiation& d);
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope();

   private:
    Differentiation& d_;
  };
  // The cotangent of an output.
  void seed(const Tensor& out, const Tensor& ct);
  void seed(const Array& out, const Array& ct);
  // The backward pass (once: a second call is an Error), then each input's cotangent: zeros
  // where no path led to it; Arrays placed on the input's sharding.
  void backward();
  // `path` names the input in the CollectiveLog ("gradient of args[0].w1") where its gradient's
  // pending sum is taken.
  Tensor grad(const Tensor& leaf, const std::string& path = "");
  Array grad(const Array& leaf, const std::string& path = "");

 private:
  std::unique_ptr<autodiff::Tape> tape_;
  struct Seeds;
  std::unique_ptr<Seeds> seeds_;
  struct Active;
  std::unique_ptr<Active> active_;
};

// A scalar float output (grad's requirement), else an Error saying what it got.
void check_scalar_output(const Shape& shape, DType dtype, const char* api);
[[noreturn]] void throw_no_leaves(const char* api, size_t argnum);
[[noreturn]] void throw_ct_structure(size_t outputs, size_t cotangents);

template <class Tree>
size_t watch_tree(Differentiation& rec, Tree& tree, const std::string& root, const char* api) {
  size_t n = 0;
  tree_visit(
      tree,
      [&](auto& leaf, const std::string& path) {
        rec.watch(leaf, path, api);
        ++n;
      },
      root);
  return n;
}

template <class Tree>
Tree grads_of(Differentiation& rec, const Tree& watched, const std::string& root = "primal") {
  Tree g = watched;
  tree_visit(
      g, [&](auto& leaf, const std::string& path) { leaf = rec.grad(leaf, path); }, root);
  return g;
}

template <class Tree>
void seed_tree(Differentiation& rec, const Tree& out, const Tree& ct) {
  std::vector<std::pair<const Tensor*, const Array*>> outs, cts;
  tree_visit(out, [&](const auto& leaf, const std::string&) {
    if constexpr (std::is_same_v<std::decay_t<decltype(leaf)>, Tensor>)
      outs.emplace_back(&leaf, nullptr);
    else
      outs.emplace_back(nullptr, &leaf);
  });
  tree_visit(ct, [&](const auto& leaf, const std::string&) {
    if constexpr (std::is_same_v<std::decay_t<decltype(leaf)>, Tensor>)
      cts.emplace_back(&leaf, nullptr);
    else
      cts.emplace_back(nullptr, &leaf);
  });
  if (outs.size() != cts.size()) throw_ct_structure(outs.size(), cts.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].first != nullptr && cts[i].first != nullptr)
      rec.seed(*outs[i].first, *cts[i].first);
    else if (outs[i].second != nullptr && cts[i].second != nullptr)
      rec.seed(*outs[i].second, *cts[i].second);
    else
      throw_ct_structure(outs.size(), cts.size());
  }
}

template <int... N>
struct Argnums {
  static constexpr std::array<int, sizeof...(N)> value{N...};
};

// Runs f on copies of args whose argnums are watched; returns the output and the recording.
template <class F, class ArgsTuple, int... N>
auto record(const F& f, ArgsTuple& args, Differentiation& rec, const char* api) {
  auto watch_one = [&]<size_t I>(std::integral_constant<size_t, I>) {
    constexpr bool wanted = ((N == static_cast<int>(I)) || ...);
    if constexpr (wanted) {
      if (watch_tree(rec, std::get<I>(args), "args[" + std::to_string(I) + "]", api) == 0)
        throw_no_leaves(api, I);
    }
  };
  [&]<size_t... I>(std::index_sequence<I...>) {
    (watch_one(std::integral_constant<size_t, I>{}), ...);
  }
  (std::make_index_sequence<std::tuple_size_v<ArgsTuple>>{});
  typename Differentiation::Scope on(rec);
  return std::apply(f, args);
}

template <class Out>
Out ones_like_output(const Out& out) {
  if constexpr (std::is_same_v<Out, Array>) {
    return ones(out.shape(), out.dtype(), out.sharding());
  } else {
    return ones(out.shape(), out.dtype(), out.device());
  }
}

template <int... N, class F, class... A>
auto value_and_grad_call(const F& f, const char* api, const A&... a) {
  static_assert(sizeof...(N) > 0);
  static_assert(((N >= 0 && N < static_cast<int>(sizeof...(A))) && ...),
                "argnums must name arguments of the function");
  std::tuple<std::decay_t<A>...> args(a...);
  Differentiation rec;
  auto out = record<F, decltype(args), N...>(f, args, rec, api);
  using Out = decltype(out);
  static_assert(std::is_same_v<Out, Array> || std::is_same_v<Out, Tensor>,
                "grad / value_and_grad need a function returning one scalar Array or Tensor "
                "(use vjp for other outputs)");
  check_scalar_output(out.shape(), out.dtype(), api);
  rec.seed(out, ones_like_output(out));
  rec.backward();
  if constexpr (sizeof...(N) == 1) {
    constexpr int k = Argnums<N...>::value[0];
    return std::make_pair(out, grads_of(rec, std::get<k>(args), "args[" + std::to_string(k) + "]"));
  } else {
    return std::make_pair(out, std::make_tuple(grads_of(rec, std::get<N>(args),
                                                        "args[" + std::to_string(N) + "]")...));
  }
}

}  // namespace autodiff_detail

// value_and_grad(f)(args...) -> std::pair(f(args...), gradient w.r.t. argument 0);
// value_and_grad<i, j>(f) -> the gradients as std::tuple, in argnums order. f returns a scalar
// float Array or Tensor; the differentiated arguments are Arrays, Tensors or trees of them.
template <int... N, class F>
auto value_and_grad(F f) {
  return [f = std::move(f)](const auto&... args) {
    if constexpr (sizeof...(N) == 0) {
      return autodiff_detail::value_and_grad_call<0>(f, "value_and_grad", args...);
    } else {
      return autodiff_detail::value_and_grad_call<N...>(f, "value_and_grad", args...);
    }
  };
}

// grad(f)(args...) -> the gradient only (see value_and_grad).
template <int... N, class F>
auto grad(F f) {
  return [f = std::move(f)](const auto&... args) {
    if constexpr (sizeof...(N) == 0) {
      return autodiff_detail::value_and_grad_call<0>(f, "grad", args...).second;
    } else {
      return autodiff_detail::value_and_grad_call<N...>(f, "grad", args...).second;
    }
  };
}

// The pullback vjp returns: pullback(ct) -> std::tuple of cotangents, one per primal (trees
// shaped like the primals). Runs once: its record is freed by the first call.
template <class Out, class... A>
class Pullback {
 public:
  // Made by vjp(): the recording, the primals it followed and the primal output.
  Pullback(std::shared_ptr<autodiff_detail::Differentiation> rec, std::tuple<A...> watched, Out out)
      : rec_(std::move(rec)), watched_(std::move(watched)), out_(std::move(out)) {}
  // The cotangents of the primals for the output cotangent `ct` (a tree shaped like the
  // output). Call it once: a second call is an Error.
  std::tuple<A...> operator()(const Out& ct) const {
    autodiff_detail::seed_tree(*rec_, out_, ct);
    rec_->backward();
    return std::apply(
        [&](const auto&... w) { return std::make_tuple(autodiff_detail::grads_of(*rec_, w)...); },
        watched_);
  }

 private:
  std::shared_ptr<autodiff_detail::Differentiation> rec_;
  std::tuple<A...> watched_;
  Out out_;
};

// vjp(f, primals...) -> std::pair(f(primals...), pullback). f may return any tree.
template <class F, class... A>
auto vjp(F f, const A&... primals) {
  auto rec = std::make_shared<autodiff_detail::Differentiation>();
  std::tuple<std::decay_t<A>...> args(primals...);
  size_t leaves = 0;
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((leaves += autodiff_detail::watch_tree(*rec, std::get<I>(args),
                                            "primals[" + std::to_string(I) + "]", "vjp")),
     ...);
  }
  (std::index_sequence_for<A...>{});
  if (leaves == 0) autodiff_detail::throw_no_leaves("vjp", 0);
  auto out = [&] {
    autodiff_detail::Differentiation::Scope on(*rec);
    return std::apply(f, args);
  }();
  using Out = decltype(out);
  return std::make_pair(out, Pullback<Out, std::decay_t<A>...>(rec, std::move(args), out));
}

// jvp(f, primals, tangents) -> std::pair(f(primals...), the directional derivative), primals and
// tangents as std::tuple (std::make_tuple(a, b)) of matching trees. Forward mode, computed as the
// transpose of the (linear) backward pass.
template <class F, class... A>
auto jvp(F f, const std::tuple<A...>& primals, const std::tuple<A...>& tangents) {
  // Named references, not a structured binding: lambdas may capture them before C++20's rule
  // reached every compiler (clang < 16).
  auto primal = std::apply([&](const A&... p) { return vjp(f, p...); }, primals);
  auto& out = primal.first;
  auto& pullback = primal.second;
  using Out = std::decay_t<decltype(out)>;
  // u -> pullback(u) is linear; its transpose at `tangents` is the jvp.
  Out u = out;
  tree_visit(u, [](auto& leaf, const std::string&) {
    using L = std::decay_t<decltype(leaf)>;
    if constexpr (std::is_same_v<L, Array>) {
      leaf = zeros(leaf.shape(), leaf.dtype(), leaf.sharding());
    } else {
      leaf = zeros(leaf.shape(), leaf.dtype(), leaf.device());
    }
  });
  auto [cts, transpose] = vjp([&](const Out& ct) { return pullback(ct); }, u);
  return std::make_pair(out, std::get<0>(transpose(tangents)));
}

}  // namespace meshrt
