// runtime/tree_shard_map.h: shard_map over trees of Arrays, with in_specs/out_specs as trees.
//
//   template <class A> struct Layer { A w, b; };
//   MESHRT_TREE_TEMPLATE(Layer, w, b);
//
//   auto f = tree_shard_map(
//       [](Context& ctx, const Tensor& x, const Layer<Tensor>& l) {
//         return std::vector<Tensor>{ctx.psum(matmul(x, l.w), "data") + l.b};
//       },
//       mesh, std::make_tuple(P("data"), Layer<PartitionSpec>{P(), P()}), std::vector{P()});
//   std::vector<Array> y = f(x, Layer<Array>{w, b});
//
// The arguments are trees of Arrays (see runtime/tree.h); the body receives each as the same
// tree of Tensors (its device's blocks): std::vector<Array> as std::vector<Tensor>, a
// std::map / std::tuple / std::array likewise, a MESHRT_TREE_TEMPLATE struct Layer<Array> as
// Layer<Tensor>; static fields are copied. The body returns a tree of Tensors and the call
// returns the same tree of Arrays.
//
// in_specs: one spec tree per argument, as a std::tuple (std::make_tuple(P("data"), specs)) or a
// std::vector<PartitionSpec>, or one PartitionSpec for every leaf of every argument. A spec tree
// has its argument's structure, or stops early: one PartitionSpec stands for every leaf below it
// (JAX's tree prefixes: P() replicates a whole Layer). A struct's specs may be the same template
// of PartitionSpec (Layer<PartitionSpec>) or any registered struct with the same field names.
// out_specs: the same for the body's result; where one PartitionSpec stands for a subtree, the
// subtree's number of leaves must be known from its type (a Tensor, a std::array, a tuple or a
// struct of them), as out_specs are fixed before the body runs; a std::vector or std::map
// output needs one spec per element.
//
// Built on the flat shard_map (one list of Arrays in, one list out), so everything shard_map
// does holds here too: resharding of inputs, replication checks, errors naming the body, and
// differentiation through it. Structure mismatches name the path ("args[1].w", "out[2]").
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/array.h"
#include "runtime/context.h"
#include "runtime/mesh.h"
#include "runtime/partition_spec.h"
#include "runtime/shard_map.h"
#include "runtime/tensor.h"
#include "runtime/tree.h"

namespace meshrt {

namespace tree_detail {

// The leaf maps that turn an argument into the body's view and a result back (used in
// decltype: what map_node builds).
struct ToTensor {
  template <class L>
  Tensor operator()(const std::string&, const L&) const {
    return {};
  }
};
template <class Tree, class Fn>
using mapped_t = decltype(map_node<false>(std::declval<const Walk&>(), std::declval<Fn&>(),
                                          std::declval<const std::string&>(),
                                          std::declval<const Tree&>(), std::tuple<>{}));

// The number of leaves every value of type T has, or -1 when it depends on the value (a
// std::vector or std::map inside).
template <class T>
constexpr long fixed_leaf_count();
template <class Tup, size_t... I>
constexpr long sum_fixed_leaf_counts(std::index_sequence<I...>) {
  long counts[] = {0, fixed_leaf_count<std::remove_cvref_t<std::tuple_element_t<I, Tup>>>()...};
  long sum = 0;
  for (long c : counts) {
    if (c < 0) return -1;
    sum += c;
  }
  return sum;
}
template <class T>
constexpr long fixed_leaf_count() {
  if constexpr (!has_leaves_v<T>) {
    return 0;
  } else if constexpr (is_leaf_v<T>) {
    return 1;
  } else if constexpr (is_std_array<T>::value) {
    constexpr long each = fixed_leaf_count<typename T::value_type>();
    return each < 0 ? -1 : each * static_cast<long>(std::tuple_size_v<T>);
  } else if constexpr (is_tuple_like<T>::value) {
    return sum_fixed_leaf_counts<T>(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (registered<T>) {
    return sum_fixed_leaf_counts<fields_t<T>>(
        std::make_index_sequence<std::tuple_size_v<fields_t<T>>>{});
  } else {
    return -1;
  }
}

// How a type reads in an error: "a Tensor", "a std::vector", "a Layer<Tensor>".
template <class T>
std::string describe_type() {
  if constexpr (std::is_same_v<T, Tensor>) {
    return "a Tensor";
  } else if constexpr (std::is_same_v<T, Array>) {
    return "an Array";
  } else if constexpr (is_vector<T>::value) {
    return "a std::vector";
  } else if constexpr (is_std_array<T>::value) {
    return "a std::array of " + std::to_string(std::tuple_size_v<T>);
  } else if constexpr (is_tuple_like<T>::value) {
    return "a std::tuple of " + std::to_string(std::tuple_size_v<T>);
  } else if constexpr (is_string_map<T>::value) {
    return "a std::map";
  } else {
    return "a " + type_name(typeid(T));
  }
}

template <class R, class S>
void flatten_out_specs(const Walk& w, const std::string& path, const S& s,
                       std::vector<PartitionSpec>& out, std::vector<std::string>& out_paths);

template <class R, class S, size_t... I>
void flatten_tuple_out_specs(const Walk& w, const std::string& path, const S& s,
                             std::vector<PartitionSpec>& out, std::vector<std::string>& out_paths,
                             std::index_sequence<I...>) {
  (flatten_out_specs<std::tuple_element_t<I, R>>(w, path + "[" + std::to_string(I) + "]",
                                                 tuple_child<I>(s), out, out_paths),
   ...);
}
template <class R, class S, size_t... I>
void flatten_struct_out_specs(const Walk& w, const std::string& path, const S& s,
                              std::vector<PartitionSpec>& out, std::vector<std::string>& out_paths,
                              std::index_sequence<I...>) {
  (flatten_out_specs<field_t<R, I>>(w, path + "." + std::string(field_names_c<R>()[I]),
                                    field_child<R, I>(s), out, out_paths),
   ...);
}

// out_specs flattened to one PartitionSpec per leaf of the body's result type R, in tree_visit
// order (before the body runs: the flat shard_map needs them first).
template <class R, class S>
void flatten_out_specs(const Walk& w, const std::string& path, const S& s,
                       std::vector<PartitionSpec>& out, std::vector<std::string>& out_paths) {
  if constexpr (!has_leaves_v<R>) {
    return;
  } else if constexpr (!is_node_v<S>) {
    if constexpr (!std::is_convertible_v<const S&, const PartitionSpec&>) {
      throw_error(
          w, "out_specs hold " + describe(s) + " at " + path + "; a PartitionSpec is required");
    } else if constexpr (fixed_leaf_count<R>() >= 0) {
      out.insert(out.end(), static_cast<size_t>(fixed_leaf_count<R>()), s);
      out_paths.insert(out_paths.end(), static_cast<size_t>(fixed_leaf_count<R>()), path);
    } else {
      throw_error(w, "out_specs has one PartitionSpec at " + path + " for " + describe_type<R>() +
                         " of the body's result, whose number of Tensors is known only when the "
                         "body runs; give one PartitionSpec per element there");
    }
  } else if constexpr (is_leaf_v<R> || !compatible<false, R, S>()) {
    throw_mismatch(w, path, 1, describe_type<R>(), describe(s));
  } else if constexpr (is_sequence_v<R>) {
    if constexpr (is_std_array<R>::value) {
      if (s.size() != std::tuple_size_v<R>)
        throw_mismatch(w, path, 1, describe_type<R>(), describe(s));
    }
    for (size_t i = 0; i < s.size(); ++i) {
      flatten_out_specs<typename R::value_type>(w, path + "[" + std::to_string(i) + "]", s[i], out,
                                                out_paths);
    }
  } else if constexpr (is_tuple_like<R>::value) {
    if constexpr (is_sequence_v<S>) {
      if (s.size() != std::tuple_size_v<R>)
        throw_mismatch(w, path, 1, describe_type<R>(), describe(s));
    }
    flatten_tuple_out_specs<R>(w, path, s, out, out_paths,
                               std::make_index_sequence<std::tuple_size_v<R>>{});
  } else if constexpr (is_string_map<R>::value) {
    for (const auto& [key, value] : s) {
      flatten_out_specs<typename R::mapped_type>(w, path + "['" + key + "']", value, out,
                                                 out_paths);
    }
  } else {
    check_fields_present<R, S>(w, path, 1,
                               std::make_index_sequence<std::tuple_size_v<fields_t<const R>>>{});
    flatten_struct_out_specs<R>(w, path, s, out, out_paths,
                                std::make_index_sequence<std::tuple_size_v<fields_t<const R>>>{});
  }
}

}  // namespace tree_detail

// The callable tree_shard_map returns: takes one tree of Arrays per argument and returns the
// body's result tree with Arrays for Tensors. Copies share the body.
template <class Body, class InSpecs, class OutSpecs>
class TreeShardMapped {
 public:
  // Holds the body and its specs; nothing is checked or run until the call. Use tree_shard_map().
  TreeShardMapped(Body body, Mesh mesh, InSpecs in_specs, OutSpecs out_specs,
                  ShardMapOptions options)
      : body_(std::make_shared<const Body>(std::move(body))),
        mesh_(std::move(mesh)),
        in_specs_(std::move(in_specs)),
        out_specs_(std::move(out_specs)),
        options_(std::move(options)) {}

  // Runs the body over the mesh: each argument is a tree of Arrays matching its in_spec tree;
  // returns the body's result tree with an Array per Tensor, placed by out_specs. Errors name the
  // tree path of the leaf at fault.
  template <class... Args>
  auto operator()(const Args&... args) const {
    using tree_detail::map_node;
    using tree_detail::Walk;
    using R = std::remove_cvref_t<std::invoke_result_t<
        const Body&, Context&, const tree_detail::mapped_t<Args, tree_detail::ToTensor>&...>>;
    static_assert(tree_detail::has_leaves_v<R>,
                  "a tree_shard_map body returns a tree of Tensors (a Tensor, std::vector<Tensor>, "
                  "a registered struct of Tensors, ...)");
    const Walk w_in{"shard_map", "tree_shard_map", {"the arguments", "in_specs"}};
    const Walk w_out{"shard_map", "tree_shard_map", {"the body's result", "out_specs"}};

    // Flat lists for the flat shard_map, in tree_visit order.
    std::vector<Array> flat_args;
    std::vector<PartitionSpec> flat_in;
    std::vector<std::string> in_paths, out_paths;  // the leaf each flat spec belongs to
    auto take = [&](const std::string& path, const auto& leaf, const auto& spec) {
      using L = std::remove_cvref_t<decltype(leaf)>;
      using S = std::remove_cvref_t<decltype(spec)>;
      if constexpr (!std::is_same_v<L, Array>) {
        tree_detail::throw_error(w_in, path +
                                           " is a Tensor; shard_map takes Arrays (device_put "
                                           "it onto the mesh first)");
      } else if constexpr (!std::is_convertible_v<const S&, const PartitionSpec&>) {
        tree_detail::throw_error(w_in, "in_specs hold " + tree_detail::describe(spec) + " at " +
                                           path + "; a PartitionSpec is required");
      } else {
        tree_detail::check_leaf_set(w_in, path, leaf);
        flat_args.push_back(leaf);
        flat_in.push_back(spec);
        in_paths.push_back(path);
      }
      return leaf;
    };
    (void)map_node<true>(w_in, take, std::string("args"), std::forward_as_tuple(args...),
                         std::forward_as_tuple(in_specs_));
    std::vector<PartitionSpec> flat_out;
    tree_detail::flatten_out_specs<R>(w_out, "out", out_specs_, flat_out, out_paths);

    // What the per-device body needs; shared so the erased body may outlive this call.
    struct State {
      State(std::shared_ptr<const Body> b, std::tuple<Args...> a, OutSpecs o, size_t n, Walk w)
          : body(std::move(b)),
            args(std::move(a)),
            out_specs(std::move(o)),
            n_out(n),
            w_out(std::move(w)) {}
      std::shared_ptr<const Body> body;
      std::tuple<Args...> args;  // structure and static fields of the body's view
      OutSpecs out_specs;
      size_t n_out;
      Walk w_out;
      std::once_flag once;
      std::optional<R> skeleton;  // one device's result: the output's structure
    };
    auto st = std::make_shared<State>(body_, std::tuple<Args...>(args...), out_specs_,
                                      flat_out.size(), w_out);
    detail::ErasedBody erased = [st](Context& ctx, const std::vector<Tensor>& xs) {
      size_t next = 0;
      auto block = [&xs, &next](const std::string&, const auto&) -> Tensor { return xs[next++]; };
      const Walk w{"shard_map", "tree_shard_map", {}};
      auto views = map_node<false>(w, block, std::string("args"), st->args, std::tuple<>{});
      R result = std::apply([&](const auto&... v) { return (*st->body)(ctx, v...); }, views);
      std::vector<Tensor> flat;
      flat.reserve(st->n_out);
      auto give = [&](const std::string& path, const auto& leaf, const auto&) {
        if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Tensor>) {
          tree_detail::throw_error(
              st->w_out, "the body returned an Array at " + path + "; a body returns Tensors");
        } else {
          tree_detail::check_leaf_set(st->w_out, path, leaf);
          flat.push_back(leaf);
        }
        return leaf;
      };
      (void)map_node<true>(st->w_out, give, std::string("out"), result,
                           std::forward_as_tuple(st->out_specs));
      if (flat.size() != st->n_out) {
        tree_detail::throw_error(st->w_out, "the body returned " + std::to_string(flat.size()) +
                                                " Tensors for " + std::to_string(st->n_out) +
                                                " out_specs");
      }
      std::call_once(st->once, [&] { st->skeleton = result; });
      return flat;
    };
    std::vector<Array> outs;
    try {
      outs = detail::run_shard_map(erased, mesh_, flat_in, flat_out, flat_args, options_);
    } catch (const Error&) {
      tree_detail::rethrow_with_spec_paths(in_paths, out_paths);
    }
    if (!st->skeleton) {
      tree_detail::throw_error(w_out,
                               "no body ran on this process, so the result's structure is "
                               "unknown");
    }
    size_t next = 0;
    auto assemble = [&outs, &next](const std::string&, const auto&) -> Array {
      return outs[next++];
    };
    return map_node<false>(w_out, assemble, std::string("out"), *st->skeleton, std::tuple<>{});
  }

 private:
  std::shared_ptr<const Body> body_;
  Mesh mesh_;
  InSpecs in_specs_;
  OutSpecs out_specs_;
  ShardMapOptions options_;
};

// shard_map with arguments, in_specs and out_specs as trees (see the file comment):
//   body: R(Context&, const TensorTree&...), R a tree of Tensors;
//   the result: takes one tree of Arrays per argument, returns R with Arrays for Tensors.
// Specs are checked when the result is called (as in JAX).
template <class Body, class InSpecs, class OutSpecs>
auto tree_shard_map(Body body, Mesh mesh, InSpecs in_specs, OutSpecs out_specs,
                    ShardMapOptions options = {}) {
  return TreeShardMapped<Body, InSpecs, OutSpecs>(std::move(body), std::move(mesh),
                                                  std::move(in_specs), std::move(out_specs),
                                                  detail::with_name<Body>(std::move(options)));
}

}  // namespace meshrt
