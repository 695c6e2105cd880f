// runtime/tree.h: parameter structures as trees (JAX's pytrees, Equinox modules).
//
//   struct Params { Array w1, w2; std::vector<Array> biases; int layers = 2; };
//   MESHRT_TREE(Params, w1, w2, biases, layers);   // once, next to the struct (same namespace)
//
//   Params p2 = tree_map([](const Array& a) { return 2.0 * a; }, params);
//   std::vector<Array> leaves = tree_leaves(params);              // w1, w2, biases[0], ...
//   Params sharded = filter_shard(params, NamedSharding(mesh, P()));   // every leaf replicated
//   Params on_gpu = filter_shard(params, devices("cuda")[0]);            // the cross-platform move
//
// A tree is an Array or a Tensor (a leaf), a std::vector / std::array / std::tuple / std::pair /
// std::map<std::string, T> of trees, or a struct registered with MESHRT_TREE (a class template
// of one leaf type, template <class A> struct Layer { A w, b; }, with MESHRT_TREE_TEMPLATE).
// Anything else inside a tree (sizes, flags, names, an activation choice) is static: passed
// through unchanged (Equinox's eqx.partition(x, is_array)).
//
// Paths name a place in a tree from its root: "tree.biases[2]", "tree[0].w", "tree['layer1']".
// Every structure mismatch is a meshrt::Error naming the path where the trees first differ:
//   [tree] tree_map: structure mismatch at tree.biases: a std::vector of 3 in the first tree,
//   a std::vector of 2 in the second tree
//
// Trees given "as shardings" (device_put, filter_shard) or "as specs" (tree_shard_map) may stop
// early: one Sharding (or PartitionSpec) where the tree has a subtree stands for every leaf below
// it (JAX's tree prefixes). A struct's counterpart may be another registered struct with the
// same field names (struct ParamsShardings { Sharding w1, w2; std::vector<Sharding> biases; }).
//
// The functions here are templates over the caller's types; they copy Arrays and Tensors (cheap
// handles), never their data, except device_put/filter_shard, which move data as
// device_put(Array, Sharding) does.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "core/error.h"
#include "runtime/array.h"
#include "runtime/device.h"
#include "runtime/sharding.h"
#include "runtime/tensor.h"

namespace meshrt {

namespace tree_detail {

template <class T>
inline constexpr bool is_leaf_v = std::is_same_v<T, Array> || std::is_same_v<T, Tensor>;

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_std_array : std::false_type {};
template <class T, size_t N>
struct is_std_array<std::array<T, N>> : std::true_type {};
template <class T>
struct is_tuple_like : std::false_type {};
template <class... T>
struct is_tuple_like<std::tuple<T...>> : std::true_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T>
struct is_string_map : std::false_type {};
template <class T, class C, class A>
struct is_string_map<std::map<std::string, T, C, A>> : std::true_type {};

// A struct registered with MESHRT_TREE: found by argument-dependent lookup.
template <class T>
concept registered = requires(T& t) {
  meshrt_tree_fields(t);
  meshrt_tree_field_names(static_cast<const T*>(nullptr));
};

// The field names of MESHRT_TREE's argument list, split at commas.
std::vector<std::string> split_field_names(std::string_view list);

}  // namespace tree_detail

// Calls fn(leaf, path) for every Array and Tensor leaf of `tree`, depth first in declaration
// order (vector and array elements in order, map entries in key order). `path` spells where the
// leaf is, from `root`: "params.biases[2]", "tree[0].w", "grads['layer1']". Leaves may be
// modified when `tree` is not const.
template <class Tree, class Fn>
void tree_visit(Tree& tree, Fn&& fn, const std::string& root = "tree") {
  using T = std::remove_const_t<Tree>;
  if constexpr (tree_detail::is_leaf_v<T>) {
    fn(tree, root);
  } else if constexpr (tree_detail::is_vector<T>::value || tree_detail::is_std_array<T>::value) {
    for (size_t i = 0; i < tree.size(); ++i)
      tree_visit(tree[i], fn, root + "[" + std::to_string(i) + "]");
  } else if constexpr (tree_detail::is_tuple_like<T>::value) {
    [&]<size_t... I>(std::index_sequence<I...>) {
      (tree_visit(std::get<I>(tree), fn, root + "[" + std::to_string(I) + "]"), ...);
    }
    (std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (tree_detail::is_string_map<T>::value) {
    for (auto& [key, value] : tree) tree_visit(value, fn, root + "['" + key + "']");
  } else if constexpr (tree_detail::registered<T>) {
    static const std::vector<std::string> names =
        meshrt_tree_field_names(static_cast<const T*>(nullptr));
    auto fields = meshrt_tree_fields(tree);
    [&]<size_t... I>(std::index_sequence<I...>) {
      (tree_visit(std::get<I>(fields), fn, root + "." + names[I]), ...);
    }
    (std::make_index_sequence<std::tuple_size_v<decltype(fields)>>{});
  }
  // Anything else is static: no leaves.
}

namespace tree_detail {

template <class T>
inline constexpr bool is_sequence_v = is_vector<T>::value || is_std_array<T>::value;

// A container inside a tree (anything a tree walk descends into).
template <class T>
inline constexpr bool is_node_v =
    is_sequence_v<T> || is_tuple_like<T>::value || is_string_map<T>::value || registered<T>;

template <class T>
using fields_t = decltype(meshrt_tree_fields(std::declval<T&>()));

// Whether a type can hold a leaf, a type for which Leaf<type>::value is true: the walk every
// tree's has_leaves shares (trees' leaves are Arrays and Tensors; a checkpoint's are also
// ShapeDtypeStructs). The rest of a tree is static.
template <template <class> class Leaf, class T>
constexpr bool holds_leaves();
template <template <class> class Leaf, class Tup, size_t... I>
constexpr bool any_holds_leaves(std::index_sequence<I...>) {
  return (holds_leaves<Leaf, std::remove_cvref_t<std::tuple_element_t<I, Tup>>>() || ...);
}
template <template <class> class Leaf, class T>
constexpr bool holds_leaves() {
  if constexpr (Leaf<T>::value) {
    return true;
  } else if constexpr (is_string_map<T>::value) {
    return holds_leaves<Leaf, typename T::mapped_type>();
  } else if constexpr (is_sequence_v<T>) {
    return holds_leaves<Leaf, typename T::value_type>();
  } else if constexpr (is_tuple_like<T>::value) {
    return any_holds_leaves<Leaf, T>(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (registered<T>) {
    return any_holds_leaves<Leaf, fields_t<T>>(
        std::make_index_sequence<std::tuple_size_v<fields_t<T>>>{});
  } else {
    return false;
  }
}
template <class T>
struct is_leaf : std::bool_constant<is_leaf_v<T>> {};
// Whether a type can hold an Array or Tensor leaf; the rest of a tree is static.
template <class T>
constexpr bool has_leaves() {
  return holds_leaves<is_leaf, T>();
}
template <class T>
inline constexpr bool has_leaves_v = has_leaves<T>();

// MESHRT_TREE's field names at compile time (so trees of two struct types pair fields by name).
constexpr size_t count_fields(std::string_view list) {
  size_t n = 1;
  for (char c : list) n += c == ',';
  return n;
}
template <size_t N>
constexpr std::array<std::string_view, N> split_names(std::string_view list) {
  std::array<std::string_view, N> out{};
  size_t k = 0, begin = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || list[i] == ',') {
      std::string_view name = list.substr(begin, i - begin);
      while (!name.empty() && (name.front() == ' ' || name.front() == '\n')) name.remove_prefix(1);
      while (!name.empty() && (name.back() == ' ' || name.back() == '\n')) name.remove_suffix(1);
      out[k++] = name;
      begin = i + 1;
    }
  }
  return out;
}
template <class T>
constexpr auto field_names_c() {
  return meshrt_tree_field_names_c(static_cast<const T*>(nullptr));
}
inline constexpr size_t kNoField = static_cast<size_t>(-1);
// The index of the field called `name` in registered struct T, else kNoField.
template <class T>
constexpr size_t field_index(std::string_view name) {
  constexpr auto names = field_names_c<T>();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return i;
  }
  return kNoField;
}

// What a walk is for, to word its errors: "[tree] tree_map: structure mismatch at tree.b: ...".
struct Walk {
  std::string_view component;      // "tree", "shard_map"
  std::string_view api;            // "tree_map", "device_put", ...
  std::vector<std::string> roles;  // what each tree is: "the first tree", "the shardings", ...
};

// "meshrt::Sharding" -> "Sharding"; std containers spelled as in C++.
std::string type_name(const std::type_info& type);
[[noreturn]] void throw_mismatch(const Walk& w, const std::string& path, size_t k,
                                 const std::string& first, const std::string& other);
[[noreturn]] void throw_missing_field(const Walk& w, const std::string& path, size_t k,
                                      const std::string& other_type, std::string_view field);
[[noreturn]] void throw_error(const Walk& w, const std::string& what);
std::string describe_keys(const std::vector<std::string>& keys);

// How a value reads in a mismatch message: "an Array", "a std::vector of 3", "a Sharding".
template <class T>
std::string describe(const T& v) {
  if constexpr (std::is_same_v<T, Array>) {
    return "an Array";
  } else if constexpr (std::is_same_v<T, Tensor>) {
    return "a Tensor";
  } else if constexpr (is_vector<T>::value) {
    return "a std::vector of " + std::to_string(v.size());
  } else if constexpr (is_std_array<T>::value) {
    return "a std::array of " + std::to_string(v.size());
  } else if constexpr (is_tuple_like<T>::value) {
    return "a std::tuple of " + std::to_string(std::tuple_size_v<T>);
  } else if constexpr (is_string_map<T>::value) {
    std::vector<std::string> keys;
    for (const auto& kv : v) keys.push_back(kv.first);
    return "a std::map with keys " + describe_keys(keys);
  } else {
    return "a " + type_name(typeid(T));
  }
}

// ---- the lockstep walk every tree function is built on.
//
// map_node(w, fn, path, t, rs) rebuilds the primary tree `t`, calling fn(path, leaf, others...)
// at each leaf, where `others` are the corresponding parts of the other trees (a tuple of
// references, `rs`). kPrefix: the other trees may hold a non-container where `t` has a subtree,
// which then stands for every leaf below (JAX's tree prefixes).

// Can the other tree's node R stand where the primary has node T?
template <bool kPrefix, class T, class R>
constexpr bool compatible() {
  if constexpr (!is_node_v<R>) {
    return kPrefix;
  } else if constexpr (is_sequence_v<T>) {
    return is_sequence_v<R>;
  } else if constexpr (is_tuple_like<T>::value) {
    if constexpr (is_tuple_like<R>::value) {
      return std::tuple_size_v<T> == std::tuple_size_v<R>;
    } else {
      return is_sequence_v<R>;
    }
  } else if constexpr (is_string_map<T>::value) {
    return is_string_map<R>::value;
  } else {
    return registered<R>;
  }
}

// The part of the other tree `r` at element i / key / field of the primary (r itself when r is
// a prefix leaf).
template <class R>
const auto& seq_child(const R& r, size_t i) {
  if constexpr (is_node_v<R>) {
    return r[i];
  } else {
    return r;
  }
}
template <size_t I, class R>
const auto& tuple_child(const R& r) {
  if constexpr (is_tuple_like<R>::value) {
    return std::get<I>(r);
  } else if constexpr (is_node_v<R>) {
    return r[I];
  } else {
    return r;
  }
}
template <class R>
const auto& map_child(const R& r, const std::string& key) {
  if constexpr (is_node_v<R>) {
    return r.find(key)->second;
  } else {
    return r;
  }
}
template <class T, size_t I, class R>
const auto& field_child(const R& r) {
  if constexpr (is_node_v<R>) {
    constexpr size_t j = field_index<R>(field_names_c<T>()[I]);
    if constexpr (j == kNoField) {
      return r;  // never used: a missing field is reported first
    } else {
      return std::get<j>(meshrt_tree_fields(r));
    }
  } else {
    return r;
  }
}

template <class T, size_t I>
using field_t = std::remove_cvref_t<std::tuple_element_t<I, fields_t<const T>>>;

// Every field of T that holds leaves has a namesake in R (another registered struct).
template <class T, class R, size_t... I>
void check_fields_present(const Walk& w, const std::string& path, size_t k,
                          std::index_sequence<I...>) {
  constexpr auto names = field_names_c<T>();
  ((has_leaves_v<field_t<T, I>> && field_index<R>(names[I]) == kNoField
        ? throw_missing_field(w, path + "." + std::string(names[I]), k, type_name(typeid(R)),
                              names[I])
        : void()),
   ...);
}

// Sizes and keys of the other trees' nodes against the primary's (kinds are checked at compile
// time by compatible<>).
template <class T, class R>
void check_node(const Walk& w, const std::string& path, size_t k, const T& t, const R& r) {
  if constexpr (is_node_v<R>) {
    if constexpr (is_sequence_v<R> && !is_sequence_v<T>) {
      if (r.size() != std::tuple_size_v<T>) throw_mismatch(w, path, k, describe(t), describe(r));
    } else if constexpr (is_sequence_v<T>) {
      if (r.size() != t.size()) throw_mismatch(w, path, k, describe(t), describe(r));
    } else if constexpr (is_string_map<T>::value) {
      bool same = r.size() == t.size();
      for (auto it = t.begin(); same && it != t.end(); ++it) same = r.count(it->first) > 0;
      if (!same) throw_mismatch(w, path, k, describe(t), describe(r));
    } else if constexpr (registered<T> && !std::is_same_v<T, R>) {
      check_fields_present<T, R>(w, path, k,
                                 std::make_index_sequence<std::tuple_size_v<fields_t<T>>>{});
    }
  }
}

// A value of type Ret that is never made: the walk has found a mismatch.
template <class Ret>
[[noreturn]] Ret mismatch(const Walk& w, const std::string& path, size_t k,
                          const std::string& first, const std::string& other) {
  throw_mismatch(w, path, k, first, other);
}

template <class T, class Rs, size_t... K>
void check_nodes(const Walk& w, const std::string& path, const T& t, const Rs& rs,
                 std::index_sequence<K...>) {
  (check_node(w, path, K + 1, t, std::get<K>(rs)), ...);
}

// The leaf type Mapped holds where Orig holds L (Layer<Array> mapped to Layer<Tensor>: Tensor).
template <class L, class Orig, class Mapped>
constexpr auto leaf_result() {
  if constexpr (std::is_same_v<Orig, L>) {
    return std::type_identity<Mapped>{};
  } else if constexpr ((is_vector<Orig>::value && is_vector<Mapped>::value) ||
                       (is_std_array<Orig>::value && is_std_array<Mapped>::value)) {
    return leaf_result<L, typename Orig::value_type, typename Mapped::value_type>();
  } else if constexpr (is_string_map<Orig>::value && is_string_map<Mapped>::value) {
    return leaf_result<L, typename Orig::mapped_type, typename Mapped::mapped_type>();
  } else {
    return std::type_identity<void>{};
  }
}
template <class... Ts>
struct first_non_void {
  using type = void;
};
template <class T, class... Ts>
struct first_non_void<T, Ts...> {
  using type = std::conditional_t<std::is_void_v<T>, typename first_non_void<Ts...>::type, T>;
};
template <class T>
struct is_pair : std::false_type {};
template <class A, class B>
struct is_pair<std::pair<A, B>> : std::true_type {};

template <class T>
struct template_of {
  static constexpr bool one_leaf_param = false;
};
template <template <class> class Tmpl, class L>
struct template_of<Tmpl<L>> {
  static constexpr bool one_leaf_param = is_leaf_v<L>;
  using leaf = L;
  template <class U>
  using rebind = Tmpl<U>;
};

template <bool kPrefix, class Fn, class T, class Rs>
auto map_node(const Walk& w, Fn& fn, const std::string& path, const T& t, const Rs& rs);

template <size_t I, class Rs>
auto tuple_children(const Rs& rs) {
  return std::apply([](const auto&... r) { return std::forward_as_tuple(tuple_child<I>(r)...); },
                    rs);
}
template <class Rs>
auto seq_children(const Rs& rs, size_t i) {
  return std::apply([i](const auto&... r) { return std::forward_as_tuple(seq_child(r, i)...); },
                    rs);
}
template <class Rs>
auto map_children(const Rs& rs, const std::string& key) {
  return std::apply(
      [&key](const auto&... r) { return std::forward_as_tuple(map_child(r, key)...); }, rs);
}
template <class T, size_t I, class Rs>
auto field_children(const Rs& rs) {
  return std::apply([](const auto&... r) { return std::forward_as_tuple(field_child<T, I>(r)...); },
                    rs);
}

// A tuple's rebuilt type: a std::pair stays a std::pair.
template <bool kPair, class... E>
struct tuple_out {
  using type = std::tuple<E...>;
};
template <class A, class B>
struct tuple_out<true, A, B> {
  using type = std::pair<A, B>;
};

template <bool kPrefix, size_t I, class Fn, class T, class Rs>
auto map_element(const Walk& w, Fn& fn, const std::string& path, const T& t, const Rs& rs) {
  return map_node<kPrefix>(w, fn, path + "[" + std::to_string(I) + "]", std::get<I>(t),
                           tuple_children<I>(rs));
}
template <bool kPrefix, class Fn, class T, class Rs, size_t... I>
auto map_tuple_node(const Walk& w, Fn& fn, const std::string& path, const T& t, const Rs& rs,
                    std::index_sequence<I...>) {
  using Out = typename tuple_out<is_pair<T>::value,
                                 decltype(map_element<kPrefix, I>(w, fn, path, t, rs))...>::type;
  return Out{map_element<kPrefix, I>(w, fn, path, t, rs)...};  // braces: evaluated in order
}

template <bool kPrefix, class Fn, class T, class Rs, size_t... I>
auto map_array_node(const Walk& w, Fn& fn, const std::string& path, const T& t, const Rs& rs,
                    std::index_sequence<I...>) {
  using E = decltype(map_node<kPrefix>(w, fn, path, t[0], seq_children(rs, 0)));
  return std::array<E, sizeof...(I)>{
      map_node<kPrefix>(w, fn, path + "[" + std::to_string(I) + "]", t[I], seq_children(rs, I))...};
}

template <bool kPrefix, size_t I, class Fn, class T, class Rs>
auto map_field(const Walk& w, Fn& fn, const std::string& path, const T& t, const Rs& rs) {
  using F = field_t<T, I>;
  if constexpr (!has_leaves_v<F>) {
    return F(std::get<I>(meshrt_tree_fields(t)));
  } else {
    return map_node<kPrefix>(w, fn, path + "." + std::string(field_names_c<T>()[I]),
                             std::get<I>(meshrt_tree_fields(t)), field_children<T, I>(rs));
  }
}
template <bool kPrefix, size_t I, class Fn, class T, class Rs, class Out>
void assign_field(const Walk& w, Fn& fn, const std::string& path, const T& t, const Rs& rs,
                  Out& out, bool statics_too) {
  if (has_leaves_v<field_t<T, I>> || statics_too) {
    std::get<I>(meshrt_tree_fields(out)) = map_field<kPrefix, I>(w, fn, path, t, rs);
  }
}

template <bool kPrefix, class Fn, class T, class Rs, size_t... I>
auto map_struct_node(const Walk& w, Fn& fn, const std::string& path, const T& t, const Rs& rs,
                     std::index_sequence<I...>) {
  constexpr bool same =
      (std::is_same_v<decltype(map_field<kPrefix, I>(w, fn, path, t, rs)), field_t<T, I>> && ...);
  if constexpr (same) {
    T out = t;  // static fields copied
    (assign_field<kPrefix, I>(w, fn, path, t, rs, out, false), ...);
    return out;
  } else {
    static_assert(template_of<T>::one_leaf_param,
                  "tree_map over a MESHRT_TREE struct returns the same struct, so fn must return "
                  "the leaf type it is given (an Array for an Array); to change the leaf type, "
                  "write the struct as a class template of its leaf type (template <class A> "
                  "struct Layer { A w, b; }) registered with MESHRT_TREE_TEMPLATE");
    using L = typename template_of<T>::leaf;
    using U = typename first_non_void<
        typename decltype(leaf_result<L, field_t<T, I>,
                                      decltype(map_field<kPrefix, I>(w, fn, path, t,
                                                                     rs))>())::type...>::type;
    static_assert(!std::is_void_v<U>,
                  "tree_map over a MESHRT_TREE_TEMPLATE struct: no field holds the leaf type "
                  "directly (or in a std::vector/std::array/std::map), so the new leaf type is "
                  "unknown");
    using Out = typename template_of<T>::template rebind<U>;
    Out out{};
    (assign_field<kPrefix, I>(w, fn, path, t, rs, out, true), ...);
    return out;
  }
}

template <bool kPrefix, class T, class Rs, size_t... K>
constexpr size_t first_incompatible(std::index_sequence<K...>) {
  constexpr bool ok[] = {true, [] {
                           using R = std::remove_cvref_t<std::tuple_element_t<K, Rs>>;
                           if constexpr (is_leaf_v<T>) {
                             return !is_node_v<R>;
                           } else {
                             return compatible<kPrefix, T, R>();
                           }
                         }()...};
  for (size_t k = 0; k < sizeof...(K); ++k) {
    if (!ok[k + 1]) return k;
  }
  return sizeof...(K);
}

template <bool kPrefix, class Fn, class T, class Rs>
auto map_node(const Walk& w, Fn& fn, const std::string& path, const T& t, const Rs& rs) {
  constexpr size_t nr = std::tuple_size_v<Rs>;
  using Ks = std::make_index_sequence<nr>;
  constexpr size_t bad = first_incompatible<kPrefix, T, Rs>(Ks{});
  if constexpr (!has_leaves_v<T>) {
    return t;  // static
  } else if constexpr (bad != nr) {
    return mismatch<T>(w, path, bad + 1, describe(t), describe(std::get<bad>(rs)));
  } else if constexpr (is_leaf_v<T>) {
    return std::apply([&](const auto&... r) { return fn(path, t, r...); }, rs);
  } else {
    check_nodes(w, path, t, rs, Ks{});
    if constexpr (is_vector<T>::value) {
      using E = decltype(map_node<kPrefix>(w, fn, path, t[0], seq_children(rs, 0)));
      std::vector<E> out;
      out.reserve(t.size());
      for (size_t i = 0; i < t.size(); ++i) {
        out.push_back(map_node<kPrefix>(w, fn, path + "[" + std::to_string(i) + "]", t[i],
                                        seq_children(rs, i)));
      }
      return out;
    } else if constexpr (is_std_array<T>::value) {
      return map_array_node<kPrefix>(w, fn, path, t, rs,
                                     std::make_index_sequence<std::tuple_size_v<T>>{});
    } else if constexpr (is_tuple_like<T>::value) {
      return map_tuple_node<kPrefix>(w, fn, path, t, rs,
                                     std::make_index_sequence<std::tuple_size_v<T>>{});
    } else if constexpr (is_string_map<T>::value) {
      using E = decltype(map_node<kPrefix>(w, fn, path, t.begin()->second,
                                           map_children(rs, t.begin()->first)));
      std::map<std::string, E> out;
      for (const auto& [key, value] : t) {
        out.emplace(
            key, map_node<kPrefix>(w, fn, path + "['" + key + "']", value, map_children(rs, key)));
      }
      return out;
    } else {
      return map_struct_node<kPrefix>(
          w, fn, path, t, rs, std::make_index_sequence<std::tuple_size_v<fields_t<const T>>>{});
    }
  }
}

// An Array/Tensor leaf that holds nothing (a struct field never set) is named, not used.
void check_leaf_set(const Walk& w, const std::string& path, const Array& x);
void check_leaf_set(const Walk& w, const std::string& path, const Tensor& x);

// device_put of one leaf onto what the shardings tree holds there: a Sharding, a Device, or
// (for a function) what fn(path, leaf) returns.
[[noreturn]] void throw_not_sharding(const Walk& w, const std::string& path,
                                     const std::string& what);
[[noreturn]] void rethrow_at(const Walk& w, const std::string& path);
// In a catch block: rethrows the flat shard_map's error; one about an in_specs or out_specs entry
// (a detail::SpecError, maybe nested in a body's error) says which leaf the entry is the spec of
// ("in_specs[2] is the spec of args[1].w").
[[noreturn]] void rethrow_with_spec_paths(const std::vector<std::string>& in_paths,
                                          const std::vector<std::string>& out_paths);
template <class L, class S>
Array put_leaf(const Walk& w, const std::string& path, const L& leaf, const S& s) {
  check_leaf_set(w, path, leaf);
  if constexpr (std::is_convertible_v<const S&, const Sharding&> || std::is_same_v<S, Device>) {
    try {
      if constexpr (std::is_same_v<S, Device>) {
        return device_put(leaf, SingleDeviceSharding(s));
      } else {
        return device_put(leaf, static_cast<const Sharding&>(s));
      }
    } catch (const Error&) {
      rethrow_at(w, path);
    }
  } else {
    throw_not_sharding(w, path, describe(s));
  }
}

template <class Tree, class Shardings>
auto put_tree(std::string_view api, const Tree& tree, const Shardings& shardings) {
  Walk w{"tree", api, {"the tree", "the shardings"}};
  if constexpr (std::is_invocable_v<const Shardings&, const std::string&, const Array&>) {
    auto fn = [&w, &shardings](const std::string& path, const auto& leaf) -> Array {
      using L = std::remove_cvref_t<decltype(leaf)>;
      if constexpr (std::is_invocable_v<const Shardings&, const std::string&, const L&>) {
        check_leaf_set(w, path, leaf);
        return put_leaf(w, path, leaf, shardings(path, leaf));
      } else {
        throw_error(w, path +
                           " is a Tensor; the shardings function takes (const std::string& "
                           "path, const Array& leaf): device_put the Tensor first, or accept "
                           "a Tensor too");
      }
    };
    return map_node<true>(w, fn, std::string("tree"), tree, std::tuple<>{});
  } else {
    auto fn = [&w](const std::string& path, const auto& leaf, const auto& s) -> Array {
      return put_leaf(w, path, leaf, s);
    };
    return map_node<true>(w, fn, std::string("tree"), tree, std::forward_as_tuple(shardings));
  }
}

}  // namespace tree_detail

// A tree with leaves that is not itself a leaf: what the tree overloads of device_put take (an
// Array or Tensor goes to runtime/array.h's device_put).
template <class T>
concept BranchTree = !tree_detail::is_leaf_v<std::remove_cvref_t<T>> &&
                     tree_detail::is_node_v<std::remove_cvref_t<T>> &&
                     tree_detail::has_leaves_v<std::remove_cvref_t<T>>;

// tree_map(fn, tree, rest...): a tree of tree's structure whose leaves are fn(leaf, rest_leaves...)
// (JAX's jax.tree.map). The other trees have the same structure; their parts at tree's leaves are
// passed as they are (any type: Arrays, Shardings, PartitionSpecs, ...). Containers are rebuilt
// with fn's result type (std::vector<Array> becomes std::vector<Tensor> when fn returns a
// Tensor); a MESHRT_TREE struct stays that struct (fn returns the leaf type), or for a
// MESHRT_TREE_TEMPLATE struct becomes the same template of fn's result type (Layer<Array> to
// Layer<Tensor>). Static fields are copied from `tree`. Leaves are visited in tree_visit order.
// A structure mismatch is an Error naming the path:
//   [tree] tree_map: structure mismatch at tree.biases: a std::vector of 3 in the first tree, a
//   std::vector of 2 in the second tree
template <class Fn, class Tree, class... Rest>
auto tree_map(Fn&& fn, const Tree& tree, const Rest&... rest) {
  tree_detail::Walk w{"tree", "tree_map", {}};
  auto leaf_fn = [&fn](const std::string&, const auto& leaf, const auto&... r) {
    return fn(leaf, r...);
  };
  return tree_detail::map_node<false>(w, leaf_fn, std::string("tree"), tree,
                                      std::forward_as_tuple(rest...));
}

// tree_map with the path of each leaf: fn(path, leaf, rest_leaves...) (jax.tree_util's
// tree_map_with_path), paths spelled as tree_visit's from "tree".
template <class Fn, class Tree, class... Rest>
auto tree_map_with_path(Fn&& fn, const Tree& tree, const Rest&... rest) {
  tree_detail::Walk w{"tree", "tree_map_with_path", {}};
  auto leaf_fn = [&fn](const std::string& path, const auto& leaf, const auto&... r) {
    return fn(path, leaf, r...);
  };
  return tree_detail::map_node<false>(w, leaf_fn, std::string("tree"), tree,
                                      std::forward_as_tuple(rest...));
}

// The leaves of `tree` in tree_visit order (jax.tree.leaves). Every leaf must be a Leaf (Array
// by default; tree_leaves<Tensor> for Tensors): another leaf is an Error naming its path.
template <class Leaf = Array, class Tree>
std::vector<Leaf> tree_leaves(const Tree& tree, const std::string& root = "tree") {
  static_assert(tree_detail::is_leaf_v<Leaf>, "tree_leaves<Leaf>: Leaf is Array or Tensor");
  std::vector<Leaf> out;
  tree_visit(
      tree,
      [&out](const auto& leaf, const std::string& path) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Leaf>) {
          out.push_back(leaf);
        } else {
          tree_detail::throw_error(tree_detail::Walk{"tree", "tree_leaves", {}},
                                   path + " is " + tree_detail::describe(leaf) + "; tree_leaves<" +
                                       (std::is_same_v<Leaf, Array> ? "Array" : "Tensor") +
                                       "> collects " +
                                       (std::is_same_v<Leaf, Array> ? "Arrays" : "Tensors"));
        }
      },
      root);
  return out;
}

// Waits until every Array and Tensor leaf of `tree` is complete on its devices and returns `tree`
// (jax.block_until_ready): end a timed step with it, e.g. block_until_ready(value_and_grad(f)(p)).
template <class Tree>
const Tree& block_until_ready(const Tree& tree) {
  tree_visit(tree, [](const auto& leaf, const std::string&) { leaf.block_until_ready(); });
  return tree;
}

// The number of Array and Tensor leaves of `tree`.
template <class Tree>
size_t tree_num_leaves(const Tree& tree) {
  size_t n = 0;
  tree_visit(tree, [&n](const auto&, const std::string&) { ++n; });
  return n;
}

// A tree of `like`'s structure and static fields whose leaves are `leaves`, in tree_visit order
// (jax.tree.unflatten, the structure given by an example tree): the inverse of tree_leaves.
// Leaf may differ from like's leaf type as in tree_map (Layer<Array> with Tensors gives
// Layer<Tensor>). A count that differs from like's number of leaves is an Error.
template <class Tree, class Leaf>
auto tree_unflatten(const Tree& like, const std::vector<Leaf>& leaves) {
  static_assert(tree_detail::is_leaf_v<Leaf>, "tree_unflatten: the leaves are Arrays or Tensors");
  const size_t n = tree_num_leaves(like);
  tree_detail::Walk w{"tree", "tree_unflatten", {}};
  if (n != leaves.size()) {
    tree_detail::throw_error(w, "the tree has " + std::to_string(n) + " leaves but " +
                                    std::to_string(leaves.size()) + " were given");
  }
  size_t next = 0;
  auto fn = [&leaves, &next](const std::string&, const auto&) -> Leaf { return leaves[next++]; };
  return tree_detail::map_node<false>(w, fn, std::string("tree"), like, std::tuple<>{});
}

// Checks that `a` and `b` have the same structure (same containers, sizes, keys and fields
// holding leaves; leaves may differ in type, static fields are not compared); an Error naming
// the first path where they differ, from `api` ("[tree] <api>: structure mismatch at ...").
template <class A, class B>
void check_tree_structure(const A& a, const B& b, std::string_view api = "check_tree_structure") {
  tree_detail::Walk w{"tree", api, {}};
  auto fn = [](const std::string&, const auto& leaf, const auto&) { return leaf; };
  (void)tree_detail::map_node<false>(w, fn, std::string("tree"), a, std::forward_as_tuple(b));
}
// Whether `a` and `b` have the same structure (as check_tree_structure checks).
template <class A, class B>
bool tree_structure_equal(const A& a, const B& b) {
  try {
    check_tree_structure(a, b);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// device_put of every leaf of a tree (jax.device_put of a pytree); static fields pass through and
// Tensor leaves become Arrays. `shardings` is one of:
//  - a Sharding (NamedSharding, SingleDeviceSharding) or a Device: every leaf goes there;
//  - a tree of them with tree's structure, or a prefix of it (one Sharding for a whole subtree);
//    a struct's counterpart may be a registered struct with the same field names, e.g.
//      struct ParamsShardings { Sharding w1, w2; std::vector<Sharding> biases; };
//  - a function (const std::string& path, const Array& leaf) -> Sharding.
// Errors name the path: a structure mismatch, a missing field, a leaf never set, a shardings
// leaf that is not a Sharding, and any error of device_put itself.
template <class Tree, class Shardings>
requires BranchTree<Tree>
auto device_put(const Tree& tree, const Shardings& shardings) {
  return tree_detail::put_tree("device_put", tree, shardings);
}

// Equinox's filter_shard: every Array/Tensor leaf of `tree` (which may be one leaf) placed by `x`,
// as device_put above: x is a Sharding, a Device (a one-device SingleDeviceSharding; also the
// explicit cross-platform move of a whole tree, cpu -> cuda), a shardings tree or prefix, or a
// function (path, leaf) -> Sharding. Static fields pass through unchanged. Eager, so it moves
// data at once (under jax.jit Equinox applies a sharding constraint instead).
template <class Tree, class X>
auto filter_shard(const Tree& tree, const X& x) {
  return tree_detail::put_tree("filter_shard", tree, x);
}

}  // namespace meshrt
// ---- MESHRT_TREE(Struct, field, ...): up to 32 fields.
#define MESHRT_TREE_EXPAND(x) x
#define MESHRT_TREE_GET(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16,     \
                        _17, _18, _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, \
                        _32, N, ...)                                                               \
  N
#define MESHRT_TREE_F1(t, a) t.a
#define MESHRT_TREE_F2(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F1(t, __VA_ARGS__))
#define MESHRT_TREE_F3(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F2(t, __VA_ARGS__))
#define MESHRT_TREE_F4(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F3(t, __VA_ARGS__))
#define MESHRT_TREE_F5(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F4(t, __VA_ARGS__))
#define MESHRT_TREE_F6(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F5(t, __VA_ARGS__))
#define MESHRT_TREE_F7(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F6(t, __VA_ARGS__))
#define MESHRT_TREE_F8(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F7(t, __VA_ARGS__))
#define MESHRT_TREE_F9(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F8(t, __VA_ARGS__))
#define MESHRT_TREE_F10(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F9(t, __VA_ARGS__))
#define MESHRT_TREE_F11(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F10(t, __VA_ARGS__))
#define MESHRT_TREE_F12(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F11(t, __VA_ARGS__))
#define MESHRT_TREE_F13(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F12(t, __VA_ARGS__))
#define MESHRT_TREE_F14(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F13(t, __VA_ARGS__))
#define MESHRT_TREE_F15(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F14(t, __VA_ARGS__))
#define MESHRT_TREE_F16(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F15(t, __VA_ARGS__))
#define MESHRT_TREE_F17(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F16(t, __VA_ARGS__))
#define MESHRT_TREE_F18(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F17(t, __VA_ARGS__))
#define MESHRT_TREE_F19(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F18(t, __VA_ARGS__))
#define MESHRT_TREE_F20(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F19(t, __VA_ARGS__))
#define MESHRT_TREE_F21(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F20(t, __VA_ARGS__))
#define MESHRT_TREE_F22(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F21(t, __VA_ARGS__))
#define MESHRT_TREE_F23(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F22(t, __VA_ARGS__))
#define MESHRT_TREE_F24(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F23(t, __VA_ARGS__))
#define MESHRT_TREE_F25(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F24(t, __VA_ARGS__))
#define MESHRT_TREE_F26(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F25(t, __VA_ARGS__))
#define MESHRT_TREE_F27(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F26(t, __VA_ARGS__))
#define MESHRT_TREE_F28(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F27(t, __VA_ARGS__))
#define MESHRT_TREE_F29(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F28(t, __VA_ARGS__))
#define MESHRT_TREE_F30(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F29(t, __VA_ARGS__))
#define MESHRT_TREE_F31(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F30(t, __VA_ARGS__))
#define MESHRT_TREE_F32(t, a, ...) t.a, MESHRT_TREE_EXPAND(MESHRT_TREE_F31(t, __VA_ARGS__))
#define MESHRT_TREE_FIELDS(t, ...)                                                         \
  MESHRT_TREE_EXPAND(MESHRT_TREE_GET(                                                      \
      __VA_ARGS__, MESHRT_TREE_F32, MESHRT_TREE_F31, MESHRT_TREE_F30, MESHRT_TREE_F29,     \
      MESHRT_TREE_F28, MESHRT_TREE_F27, MESHRT_TREE_F26, MESHRT_TREE_F25, MESHRT_TREE_F24, \
      MESHRT_TREE_F23, MESHRT_TREE_F22, MESHRT_TREE_F21, MESHRT_TREE_F20, MESHRT_TREE_F19, \
      MESHRT_TREE_F18, MESHRT_TREE_F17, MESHRT_TREE_F16, MESHRT_TREE_F15, MESHRT_TREE_F14, \
      MESHRT_TREE_F13, MESHRT_TREE_F12, MESHRT_TREE_F11, MESHRT_TREE_F10, MESHRT_TREE_F9,  \
      MESHRT_TREE_F8, MESHRT_TREE_F7, MESHRT_TREE_F6, MESHRT_TREE_F5, MESHRT_TREE_F4,      \
      MESHRT_TREE_F3, MESHRT_TREE_F2, MESHRT_TREE_F1)(t, __VA_ARGS__))

// The three functions MESHRT_TREE and MESHRT_TREE_TEMPLATE define (`prefix`: empty, or the
// template head), found by argument-dependent lookup.
#define MESHRT_TREE_DEFINE(prefix, Type, ...)                                                     \
  prefix [[maybe_unused]] inline auto meshrt_tree_fields(Type& meshrt_tree_t) {                   \
    return std::tie(MESHRT_TREE_FIELDS(meshrt_tree_t, __VA_ARGS__));                              \
  }                                                                                               \
  prefix [[maybe_unused]] inline auto meshrt_tree_fields(const Type& meshrt_tree_t) {             \
    return std::tie(MESHRT_TREE_FIELDS(meshrt_tree_t, __VA_ARGS__));                              \
  }                                                                                               \
  prefix [[maybe_unused]] inline std::vector<std::string> meshrt_tree_field_names(const Type*) {  \
    return ::meshrt::tree_detail::split_field_names(#__VA_ARGS__);                                \
  }                                                                                               \
  prefix [[maybe_unused]] constexpr auto meshrt_tree_field_names_c(const Type*) {                 \
    return ::meshrt::tree_detail::split_names<::meshrt::tree_detail::count_fields(#__VA_ARGS__)>( \
        #__VA_ARGS__);                                                                            \
  }

// Registers `Type`'s fields as its tree structure. Use at namespace scope, in Type's namespace.
#define MESHRT_TREE(Type, ...) MESHRT_TREE_DEFINE(, Type, __VA_ARGS__)

// Registers a class template of one leaf type, for every leaf type:
//   template <class A> struct Layer { A w, b; int width = 0; };
//   MESHRT_TREE_TEMPLATE(Layer, w, b, width);
// tree_map turns a Layer<Array> into a Layer<Tensor> when fn returns Tensors, and
// tree_shard_map's body receives Layer<Tensor> for a Layer<Array> argument.
#define MESHRT_TREE_TEMPLATE(Template, ...) \
  MESHRT_TREE_DEFINE(template <class MeshrtTreeLeaf>, Template<MeshrtTreeLeaf>, __VA_ARGS__)
