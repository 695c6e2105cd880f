// autodiff/tree.h: parameter structures as trees (JAX's pytrees, Equinox modules).
//
//   struct Params { Array w1, w2; std::vector<Array> biases; int layers = 2; };
//   MESHRT_TREE(Params, w1, w2, biases, layers);   // once, next to the struct (same namespace)
//
// A tree is an Array or a Tensor (a leaf), a std::vector / std::array / std::tuple / std::pair /
// std::map<std::string, T> of trees, or a struct registered with MESHRT_TREE. Anything else
// inside a tree (sizes, flags, names, an activation choice) is static: passed through
// unchanged (Equinox's eqx.partition(x, is_array)).
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/array.h"
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

// Registers `Type`'s fields as its tree structure. Use at namespace scope, in Type's namespace.
#define MESHRT_TREE(Type, ...)                                                            \
  [[maybe_unused]] inline auto meshrt_tree_fields(Type& meshrt_tree_t) {                  \
    return std::tie(MESHRT_TREE_FIELDS(meshrt_tree_t, __VA_ARGS__));                      \
  }                                                                                       \
  [[maybe_unused]] inline auto meshrt_tree_fields(const Type& meshrt_tree_t) {            \
    return std::tie(MESHRT_TREE_FIELDS(meshrt_tree_t, __VA_ARGS__));                      \
  }                                                                                       \
  [[maybe_unused]] inline std::vector<std::string> meshrt_tree_field_names(const Type*) { \
    return ::meshrt::tree_detail::split_field_names(#__VA_ARGS__);                        \
  }
