// train/checkpoint.h: saving and restoring trees of Arrays (orbax's model), as Zarr v3 on disk.
//
//   checkpoint::save("ckpt", params, step);                       // durable when it returns
//   checkpoint::save("ckpt", params, step, {.async = true, .keep = 3});   // returns at once
//   checkpoint::wait_until_finished();                            // joins the background write
//   std::optional<int64_t> s = checkpoint::latest("ckpt");
//   Params p = checkpoint::restore("ckpt", params);               // like: the target tree
//   auto q = checkpoint::restore("ckpt", std::map<std::string, checkpoint::ShapeDtypeStruct>{
//       {"w", {.shape = {1024, 512}, .dtype = DType::f32, .sharding = NamedSharding(mesh, P())}}});
//
// Layout. `<dir>/<step>/` is a Zarr v3 group (zarr.json, node_type "group") whose attributes hold
// {"meshrt": {"format_version", "step", "leaves": [{"key", "path"}...], "metadata"}}; each leaf is
// a Zarr v3 array at its tree path as a folder path ("tree.params.W[0]" -> `params/W/0`, map
// entries by key, a tree that is one Array -> `value`), with a zarr.json for every group between.
// Chunks are the sharding's blocks (chunk grid = block grid, keys "c/i/j"), codecs bytes
// (little-endian) + crc32c, data types float32/float64/float16/int32/int64/bool and bfloat16 (the
// Zarr extension name tensorstore writes): Python's zarr.open_group(f"{dir}/{step}") reads every
// leaf but bfloat16 ones (tensorstore reads those). Static fields of the tree are not saved.
// restore() casts a floating leaf onto a target of another floating dtype (as orbax does).
//
// Guarantees. A save writes into `<dir>/<step>.tmp-<random>/`, fsyncs every file and folder,
// then renames it to `<dir>/<step>` in one step: a crash at any point leaves earlier checkpoints
// intact and never a partial `<step>`; latest() sees complete steps only. Every chunk carries a
// CRC-32C checked on restore. Each process writes only the blocks its devices hold (a replicated
// block once); under mpirun process 0 writes the metadata and renames once every process has
// written and fsynced (a barrier over the job's communication library).
// One writing job per directory: leftover `*.tmp-*` folders from crashed saves are removed by the
// next successful save.
//
// Thread-safety: call these from one thread (the training loop); at most one save is in flight.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "runtime/array.h"
#include "runtime/device.h"
#include "runtime/sharding.h"
#include "runtime/tensor.h"
#include "runtime/tree.h"

namespace meshrt::checkpoint {

// A restore target without data (jax.ShapeDtypeStruct): the shape, dtype and sharding the
// restored Array gets. `sharding` must be set (the default names no device).
struct ShapeDtypeStruct {
  Shape shape;                                         // the global shape
  DType dtype = DType::f32;                            // the element type
  Sharding sharding = SingleDeviceSharding(Device());  // where the blocks go; set it
};

// Options of save(): asynchronous writes, how many steps to keep, metadata.
struct SaveOptions {
  // Copy the blocks to the host (cpu: keep references to the immutable blocks), return, and write
  // on a background thread; the next save() or wait_until_finished() joins it and raises its
  // error, if any.
  bool async = false;
  // After a successful save keep the `keep` newest steps (by number; the step just saved is
  // always kept) and remove the others; 0 keeps every step.
  int keep = 0;
  // Saved in the group's attributes; read back with metadata().
  std::map<std::string, std::string> metadata = {};
};

namespace ckpt_detail {

struct SaveLeaf {
  std::string path;               // "tree.params.W[0]"
  std::vector<std::string> keys;  // {"params", "W", "0"}
  Array value;
};
struct Target {
  std::string path;
  std::vector<std::string> keys;
  Shape shape;
  DType dtype = DType::f32;
  Sharding sharding = SingleDeviceSharding(Device());
};

void save_leaves(const std::string& dir, std::vector<SaveLeaf> leaves, int64_t step,
                 const SaveOptions& options);
// Restored Arrays in targets' order.
std::vector<Array> restore_leaves(const std::string& dir, const std::vector<Target>& targets,
                                  std::optional<int64_t> step);
Array tensor_as_array(const Tensor& t);
// The one block of a restored Tensor leaf's Array (on the Tensor's device).
Tensor array_as_tensor(const Array& a);
[[noreturn]] void throw_shape_dtype_struct_in_save(const std::string& path);

template <class T>
inline constexpr bool is_leaf_v =
    std::is_same_v<T, Array> || std::is_same_v<T, Tensor> || std::is_same_v<T, ShapeDtypeStruct>;

template <class T>
struct is_leaf : std::bool_constant<is_leaf_v<T>> {};
// Whether a type holds Array, Tensor or ShapeDtypeStruct leaves (the rest of a tree is static):
// the trees' walk (tree_detail::holds_leaves) with a checkpoint's leaves.
template <class T>
constexpr bool has_leaves() {
  return tree_detail::holds_leaves<is_leaf, T>();
}
template <class T>
inline constexpr bool has_leaves_v = has_leaves<T>();

// Calls fn(leaf, path, keys) for every leaf in tree_visit's order, with tree_visit's paths and
// the Zarr node names of the leaf's place (field names, element indices, map keys).
template <class T, class Fn>
void walk(const T& t, Fn& fn, const std::string& path, std::vector<std::string>& keys) {
  using namespace tree_detail;
  if constexpr (is_leaf_v<T>) {
    fn(t, path, keys);
  } else if constexpr (!has_leaves_v<T>) {
    // static
  } else if constexpr (is_sequence_v<T>) {
    for (size_t i = 0; i < t.size(); ++i) {
      keys.push_back(std::to_string(i));
      walk(t[i], fn, path + "[" + keys.back() + "]", keys);
      keys.pop_back();
    }
  } else if constexpr (is_tuple_like<T>::value) {
    [&]<size_t... I>(std::index_sequence<I...>) {
      ((keys.push_back(std::to_string(I)),
        walk(std::get<I>(t), fn, path + "[" + keys.back() + "]", keys), keys.pop_back()),
       ...);
    }
    (std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (is_string_map<T>::value) {
    for (const auto& [key, value] : t) {
      keys.push_back(key);
      walk(value, fn, path + "['" + key + "']", keys);
      keys.pop_back();
    }
  } else {
    static const std::vector<std::string> names =
        meshrt_tree_field_names(static_cast<const T*>(nullptr));
    auto fields = meshrt_tree_fields(t);
    [&]<size_t... I>(std::index_sequence<I...>) {
      ((keys.push_back(names[I]), walk(std::get<I>(fields), fn, path + "." + names[I], keys),
        keys.pop_back()),
       ...);
    }
    (std::make_index_sequence<std::tuple_size_v<decltype(fields)>>{});
  }
}

// Tmpl<ShapeDtypeStruct> restores as Tmpl<Array> (a MESHRT_TREE_TEMPLATE struct).
template <class T>
struct rebind_to_array {
  static constexpr bool ok = false;
};
template <template <class> class Tmpl>
struct rebind_to_array<Tmpl<ShapeDtypeStruct>> {
  static constexpr bool ok = true;
  using type = Tmpl<Array>;
};

template <class T>
auto rebuild(const T& like, const std::vector<Array>& leaves, size_t& next);

template <class T, size_t I>
using rebuilt_field_t =
    decltype(rebuild(std::declval<const tree_detail::field_t<T, I>&>(),
                     std::declval<const std::vector<Array>&>(), std::declval<size_t&>()));

template <class T, class Out, size_t... I>
Out rebuild_struct(const T& like, const std::vector<Array>& leaves, size_t& next, Out out,
                   std::index_sequence<I...>) {
  auto from = meshrt_tree_fields(like);
  auto to = meshrt_tree_fields(out);
  (
      [&] {
        using F = tree_detail::field_t<T, I>;
        if constexpr (has_leaves_v<F>) {
          std::get<I>(to) = rebuild(std::get<I>(from), leaves, next);
        } else if constexpr (!std::is_same_v<T, Out>) {
          std::get<I>(to) = std::get<I>(from);  // static fields of a rebound template
        }
      }(),
      ...);
  return out;
}

// The tree of `like`'s structure and static fields whose leaves are leaves[next...] (Arrays;
// Tensor leaves get the restored Array's one block).
template <class T>
auto rebuild(const T& like, const std::vector<Array>& leaves, size_t& next) {
  using namespace tree_detail;
  if constexpr (std::is_same_v<T, Array> || std::is_same_v<T, ShapeDtypeStruct>) {
    return leaves[next++];
  } else if constexpr (std::is_same_v<T, Tensor>) {
    return array_as_tensor(leaves[next++]);
  } else if constexpr (!has_leaves_v<T>) {
    return like;
  } else if constexpr (is_vector<T>::value) {
    using E = decltype(rebuild(like[0], leaves, next));
    std::vector<E> out;
    out.reserve(like.size());
    for (const auto& e : like) out.push_back(rebuild(e, leaves, next));
    return out;
  } else if constexpr (is_std_array<T>::value) {
    return [&]<size_t... I>(std::index_sequence<I...>) {
      using E = decltype(rebuild(like[0], leaves, next));
      return std::array<E, sizeof...(I)>{rebuild(like[I], leaves, next)...};  // in order
    }
    (std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (is_tuple_like<T>::value) {
    return [&]<size_t... I>(std::index_sequence<I...>) {
      using Out = typename tuple_out<is_pair<T>::value,
                                     decltype(rebuild(std::get<I>(like), leaves, next))...>::type;
      return Out{rebuild(std::get<I>(like), leaves, next)...};  // braces: in order
    }
    (std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (is_string_map<T>::value) {
    using E = decltype(rebuild(like.begin()->second, leaves, next));
    std::map<std::string, E> out;
    for (const auto& [key, value] : like) out.emplace(key, rebuild(value, leaves, next));
    return out;
  } else {
    constexpr size_t n = std::tuple_size_v<fields_t<const T>>;
    constexpr bool same = []<size_t... I>(std::index_sequence<I...>) {
      return (std::is_same_v<rebuilt_field_t<T, I>, field_t<T, I>> && ...);
    }
    (std::make_index_sequence<n>{});
    if constexpr (same) {
      return rebuild_struct(like, leaves, next, T(like), std::make_index_sequence<n>{});
    } else {
      static_assert(rebind_to_array<T>::ok,
                    "checkpoint::restore: a MESHRT_TREE struct with ShapeDtypeStruct fields "
                    "restores as the same struct with Arrays, so write it as a class template of "
                    "its leaf type (template <class A> struct Layer { A w, b; }) registered with "
                    "MESHRT_TREE_TEMPLATE, or pass a struct of Arrays as the target");
      using Out = typename rebind_to_array<T>::type;
      return rebuild_struct(like, leaves, next, Out{}, std::make_index_sequence<n>{});
    }
  }
}

}  // namespace ckpt_detail

// Saves every Array and Tensor leaf of `tree` as step `step` (>= 0) of the checkpoint folder
// `dir` (created if missing). Returns once `<dir>/<step>` is complete and durable, or with
// options.async once the blocks are held on the host. Joins an earlier async save first (raising
// its error). Errors: a step that exists already, a leaf whose tree path is not a valid Zarr node
// name (an empty map key, one with '/', ".", "..", or starting "__"), an empty Array, I/O
// failures (naming the file). Every process of a multi-process job calls it with the same tree.
template <class Tree>
void save(const std::string& dir, const Tree& tree, int64_t step, const SaveOptions& options = {}) {
  std::vector<ckpt_detail::SaveLeaf> leaves;
  auto fn = [&leaves](const auto& leaf, const std::string& path,
                      const std::vector<std::string>& keys) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<L, Array>) {
      leaves.push_back({path, keys, leaf});
    } else if constexpr (std::is_same_v<L, Tensor>) {
      leaves.push_back({path, keys, ckpt_detail::tensor_as_array(leaf)});
    } else {
      ckpt_detail::throw_shape_dtype_struct_in_save(path);
    }
  };
  std::vector<std::string> keys;
  ckpt_detail::walk(tree, fn, std::string("tree"), keys);
  ckpt_detail::save_leaves(dir, std::move(leaves), step, options);
}

// Waits for the async save in flight, if any, and raises its error (once).
void wait_until_finished();

// The newest complete step in `dir`, or nullopt when there is none (or no such folder).
// In-progress and crashed saves (`*.tmp-*`) are never seen.
std::optional<int64_t> latest(const std::string& dir);
// Every complete step in `dir`, ascending.
std::vector<int64_t> all_steps(const std::string& dir);
// The user metadata saved with a step (default: the latest).
std::map<std::string, std::string> metadata(const std::string& dir,
                                            std::optional<int64_t> step = std::nullopt);

// Restores step `step` (default: latest) of `dir` onto `like`'s structure: a tree of Arrays
// (each leaf gets that Array's shape, dtype and sharding), of ShapeDtypeStructs, or a mix
// (Tensor leaves restore onto their device). Returns the tree with Arrays (a vector of
// ShapeDtypeStruct gives a vector of Array; Layer<ShapeDtypeStruct> gives Layer<Array>); static
// fields are copied from `like`. Any mesh and sharding works whatever the saved one: each device's
// block is assembled from the chunks overlapping it, and each process reads only those chunks.
// Joins an async save in flight first. Errors name the leaf: a tree that does not match the
// saved leaves, a shape or dtype mismatch, a missing folder or step, a newer format, a chunk
// that is missing, truncated, or fails its checksum.
template <class Tree>
auto restore(const std::string& dir, const Tree& like, std::optional<int64_t> step = std::nullopt) {
  std::vector<ckpt_detail::Target> targets;
  auto fn = [&targets](const auto& leaf, const std::string& path,
                       const std::vector<std::string>& keys) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<L, Array>) {
      targets.push_back({path, keys, leaf.shape(), leaf.dtype(), leaf.sharding()});
    } else if constexpr (std::is_same_v<L, Tensor>) {
      targets.push_back(
          {path, keys, leaf.shape(), leaf.dtype(), SingleDeviceSharding(leaf.device())});
    } else {
      targets.push_back({path, keys, leaf.shape, leaf.dtype, leaf.sharding});
    }
  };
  std::vector<std::string> keys;
  ckpt_detail::walk(like, fn, std::string("tree"), keys);
  std::vector<Array> leaves = ckpt_detail::restore_leaves(dir, targets, step);
  size_t next = 0;
  return ckpt_detail::rebuild(like, leaves, next);
}

}  // namespace meshrt::checkpoint
