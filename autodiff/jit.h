// meshrt/jit.h: jit: trace a function of Arrays (and trees of them) once, replay it many times.
//
//   auto step = jit(f, {.in_shardings = {NamedSharding(mesh, P("x"))}});
//   Array y = step(x);                                   // traces f, returns the eager result
//   Array y2 = step(x2);                                 // same signature: replays the program
//   std::cout << step.lower(x).as_text();               // ops, shardings, inserted collectives
//   std::string dot = step.lower(x).as_dot();            // Graphviz
//
// A call's signature is each Array leaf's shape, dtype and sharding (devices included, pending
// sums too), the tree structure of the arguments (their leaves' paths) and the values of
// arguments that hold no Array (static arguments, compared with ==; JAX's static_argnums). A
// new signature traces again. Tracing runs f once, eagerly, recording every per-device launch of
// the global view; a replay runs the recorded steps on the new inputs without the eager ops'
// checks and placement planning: steps without collectives from the caller's thread, device
// after device; consecutive steps with collectives as one task per device; reshards between
// meshes from the caller. Results equal the eager run's bit for bit (the same kernels run on the
// same blocks).
//
// As in JAX, f's C++ control flow is frozen at trace time, and reading a value computed inside f
// (to_vector, addressable_shards) is an Error while tracing. Static fields inside trees (a
// MESHRT_TREE struct's int) are frozen at trace time too. Not supported inside f yet (an Error at
// trace time): shard_map, and ops that compute without a global-view launch.
//
// Inside another transform (value_and_grad of a jitted function, a jitted function called while
// an outer jit traces) a jitted function runs f eagerly so that the outer transform sees its ops.
//
// Thread-safety: a Jitted may be called from several threads; its cache is guarded by a mutex.
#pragma once

#include <any>
#include <concepts>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"
#include "global/array_ops.h"
#include "global/jit_program.h"
#include "runtime/array.h"
#include "runtime/sharding.h"
#include "runtime/tree.h"

namespace meshrt {

// Options of jit(): JAX's in_shardings, out_shardings and donate_argnums, and a name.
struct JitOptions {
  // One entry per positional argument: every Array leaf of that argument is placed on this
  // sharding before the program runs (device_put; nullopt or a missing entry: as given). A
  // sharding on another mesh than the leaf's is an Error (device_put the argument first).
  std::vector<std::optional<Sharding>> in_shardings = {};
  // One entry per Array leaf of the result (in tree_visit order), or one entry for every leaf:
  // the result is constrained to it inside the program (the spec must divide the shape).
  std::vector<std::optional<Sharding>> out_shardings = {};
  // Positional arguments whose buffers the call may reuse (JAX's donate_argnums): their Array
  // leaves are reset to empty Arrays in the caller's argument (as JAX deletes donated arrays),
  // so the program holds the last reference and drops each block after its last use. The
  // argument must be passed non-const.
  std::vector<int> donate_argnums = {};
  // The program's name in lower()'s text (default "f").
  std::string name = "f";
};

// A traced program in printable form (JAX's Lowered): see jit().
class Lowered {
 public:
  // `donated`: per input leaf, whether the jit's donate_argnums donates it.
  explicit Lowered(std::shared_ptr<const detail::JitProgram> program,
                   std::vector<bool> donated = {})
      : program_(std::move(program)), donated_(std::move(donated)) {}
  // One line per op: operands and results with shapes and shardings, the collectives it
  // inserted with bytes per device, "(unused: not replayed)" on ops whose results nothing reads;
  // then how a replay launches and, with donate_argnums, how many steps write in place.
  std::string as_text() const { return detail::jit_text(*program_, donated_); }
  // A Graphviz digraph of the same (collectives as red octagons): `dot -Tsvg` renders it.
  std::string as_dot() const { return detail::jit_dot(*program_); }

 private:
  std::shared_ptr<const detail::JitProgram> program_;
  std::vector<bool> donated_;
};

namespace jit_detail {

// Message text from pieces (core/strings.h is not installed).
template <class... T>
std::string msg(const T&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <class A>
using static_slot_t = std::conditional_t<tree_detail::has_leaves_v<std::remove_cvref_t<A>>,
                                         std::monostate, std::remove_cvref_t<A>>;

// The Array leaves of `tree` (Tensor leaves are an Error naming the path), with their paths.
template <class Tree>
void flatten(const Tree& tree, const std::string& root, std::vector<Array>& leaves,
             std::vector<std::string>& paths) {
  if constexpr (tree_detail::has_leaves_v<Tree>) {
    tree_visit(
        tree,
        [&](const auto& leaf, const std::string& path) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
            leaves.push_back(leaf);
            paths.push_back(path);
          } else {
            throw Error(jit_detail::msg("[jit] ", path,
                                        " is a Tensor; jit takes Arrays (device_put the Tensor "
                                        "onto a sharding first)"));
          }
        },
        root);
  }
}

// `tree` with its leaves replaced, in order, by `leaves[next...]`.
template <class Tree>
Tree rebuild(const Tree& tree, const std::vector<Array>& leaves, size_t& next) {
  if constexpr (!tree_detail::has_leaves_v<Tree>) {
    return tree;
  } else {
    Tree out = tree;
    tree_visit(out, [&](auto& leaf, const std::string&) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
        leaf = leaves[next++];
      }
    });
    return out;
  }
}

template <class Tree>
void clear_leaves(Tree& tree) {
  if constexpr (tree_detail::has_leaves_v<Tree>) {
    tree_visit(tree, [](auto& leaf, const std::string&) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) leaf = Array();
    });
  }
}

}  // namespace jit_detail

// jit(f, options): see the file comment. f takes Arrays, trees of Arrays and static values and
// returns an Array or a tree of Arrays. Copies share the compiled programs.
template <class F>
class Jitted {
 public:
  // Wraps f; nothing is traced until the first call. Use jit().
  Jitted(F f, JitOptions options)
      : f_(std::move(f)), options_(std::move(options)), cache_(std::make_shared<Cache>()) {}

  // Runs f on `args`: the first call with a new signature (shapes, dtypes, shardings, static
  // values) traces f and compiles it; later calls replay the compiled program. Donated arguments
  // are reset to empty Arrays. Returns what f returns.
  template <class... Args>
  auto operator()(Args&&... args) const {
    using R = std::invoke_result_t<const F&, const std::remove_cvref_t<Args>&...>;
    if (detail::jit_inside_transform()) return f_(args...);
    Call call = flatten_call(args...);
    std::vector<bool> donated = donated_mask<Args...>(call);
    std::shared_ptr<Entry> entry = find<Args...>(call.key, args...);
    if (entry == nullptr) {
      auto [e, result] = trace<R>(call, args...);
      entry = e;
      clear_donated<0>(std::forward_as_tuple(args...), std::index_sequence_for<Args...>{});
      return result;
    }
    clear_donated<0>(std::forward_as_tuple(args...), std::index_sequence_for<Args...>{});
    std::vector<Array> outs = detail::jit_replay(*entry->program, std::move(call.leaves), donated);
    const R& like = std::any_cast<const R&>(entry->like);
    if constexpr (std::is_same_v<R, Array>) {
      return outs.front();
    } else {
      return tree_unflatten(like, outs);
    }
  }

  // The program for these arguments (traced now unless their signature was seen), printable.
  template <class... Args>
  Lowered lower(const Args&... args) const {
    using R = std::invoke_result_t<const F&, const Args&...>;
    Call call = flatten_call(args...);
    std::shared_ptr<Entry> entry = find<Args...>(call.key, args...);
    if (entry == nullptr) entry = trace<R>(call, args...).first;
    std::vector<bool> donated;
    for (size_t i = 0; i < call.leaves.size(); ++i) {
      const int a = static_cast<int>(call.arg_of[i]);
      donated.push_back(std::find(options_.donate_argnums.begin(), options_.donate_argnums.end(),
                                  a) != options_.donate_argnums.end());
    }
    return Lowered(entry->program, std::move(donated));
  }

  // How many signatures have been traced.
  size_t trace_count() const {
    std::lock_guard<std::mutex> lock(cache_->mu);
    return cache_->traces;
  }

 private:
  struct Entry {
    std::shared_ptr<const detail::JitProgram> program;
    std::any like;     // the result of the trace call: the output tree's structure
    std::any statics;  // the static arguments' values
  };
  struct Cache {
    mutable std::mutex mu;
    std::multimap<std::string, std::shared_ptr<Entry>> entries;  // guarded by mu
    size_t traces = 0;                                           // guarded by mu
  };
  struct Call {
    std::vector<Array> leaves;
    std::vector<std::string> paths;
    std::vector<size_t> arg_of;  // per leaf: its positional argument
    std::string key;
  };

  template <class... Args>
  Call flatten_call(const Args&... args) const {
    Call c;
    size_t k = 0;
    auto one = [&](const auto& a) {
      const size_t first = c.leaves.size();
      jit_detail::flatten(a, jit_detail::msg("args[", k, "]"), c.leaves, c.paths);
      for (size_t i = first; i < c.leaves.size(); ++i) {
        c.arg_of.push_back(k);
        place(c.leaves[i], k, c.paths[i]);
      }
      ++k;
    };
    (one(args), ...);
    for (size_t i = 0; i < c.leaves.size(); ++i) {
      c.key += c.paths[i] + "=" + detail::jit_signature(c.leaves[i]) + ";";
    }
    c.key += jit_detail::msg("#", k);
    return c;
  }

  // in_shardings: the leaf moved onto the argument's sharding (same mesh only).
  void place(Array& leaf, size_t k, const std::string& path) const {
    if (k >= options_.in_shardings.size() || !options_.in_shardings[k]) return;
    const Sharding& s = *options_.in_shardings[k];
    if (!leaf.valid()) {
      throw Error(jit_detail::msg("[jit] ", path,
                                  " is an empty (default-constructed, moved-from or "
                                  "donated) Array"));
    }
    if (!s.same_domain(leaf.sharding())) {
      throw Error(jit_detail::msg("[jit] in_shardings[", k, "] is ", s.str(), " but ", path,
                                  " lives on ", leaf.sharding().str(),
                                  ", another mesh; device_put the argument onto the jitted "
                                  "function's mesh first (or change in_shardings)"));
    }
    if (!(leaf.sharding() == s)) leaf = device_put(leaf, s);
  }

  template <class... Args>
  std::vector<bool> donated_mask(const Call& c) const {
    constexpr bool is_const[] = {std::is_const_v<std::remove_reference_t<Args>>..., false};
    const size_t n = sizeof...(Args);
    std::vector<bool> arg_donated(n, false);
    for (int a : options_.donate_argnums) {
      if (a < 0 || static_cast<size_t>(a) >= n) {
        throw Error(jit_detail::msg("[jit] donate_argnums has ", a,
                                    " but the function was called with ", n, " arguments"));
      }
      if (is_const[a]) {
        throw Error(
            jit_detail::msg("[jit] donate_argnums has ", a, " but args[", a,
                            "] is passed const; pass it non-const (its Arrays are deleted by "
                            "the call, as JAX deletes donated buffers) or do not donate it"));
      }
      arg_donated[static_cast<size_t>(a)] = true;
    }
    std::vector<bool> m;
    for (size_t i = 0; i < c.leaves.size(); ++i) m.push_back(arg_donated[c.arg_of[i]]);
    return m;
  }

  template <size_t I, class Tup, size_t... K>
  void clear_donated(Tup&& args, std::index_sequence<K...>) const {
    auto one = [&](auto& a, size_t k) {
      using A = std::remove_reference_t<decltype(a)>;
      if constexpr (!std::is_const_v<A>) {
        for (int d : options_.donate_argnums) {
          if (static_cast<size_t>(d) == k) jit_detail::clear_leaves(a);
        }
      }
    };
    (one(std::get<K>(args), K), ...);
  }

  template <class... Args>
  std::shared_ptr<Entry> find(const std::string& key, const Args&... args) const {
    using Statics = std::tuple<jit_detail::static_slot_t<Args>...>;
    Statics now{static_of(args)...};
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto [lo, hi] = cache_->entries.equal_range(key);
    for (auto it = lo; it != hi; ++it) {
      const Statics* s = std::any_cast<Statics>(&it->second->statics);
      if (s != nullptr && *s == now) return it->second;
    }
    return nullptr;
  }

  template <class A>
  static jit_detail::static_slot_t<A> static_of(const A& a) {
    if constexpr (tree_detail::has_leaves_v<A>) {
      return {};
    } else {
      static_assert(std::equality_comparable<A>,
                    "jit: an argument holding no Array is static and is compared with == to "
                    "find the traced program; give it operator==");
      return a;
    }
  }

  template <class R, class... Args>
  std::pair<std::shared_ptr<Entry>, R> trace(Call& call, const Args&... args) const {
    using Statics = std::tuple<jit_detail::static_slot_t<Args>...>;
    std::vector<Array> inputs = call.leaves;
    std::optional<R> result;
    std::shared_ptr<const detail::JitProgram> program;
    {
      detail::JitTrace tr(inputs, call.paths, options_.name);
      size_t next = 0;
      std::tuple<std::remove_cvref_t<Args>...> traced{jit_detail::rebuild(args, inputs, next)...};
      result.emplace(std::apply(f_, std::as_const(traced)));
      std::vector<Array> outs;
      std::vector<std::string> out_paths;
      jit_detail::flatten(*result, "out", outs, out_paths);
      constrain_outputs(outs, out_paths);
      if (!options_.out_shardings.empty()) {
        if constexpr (std::is_same_v<R, Array>) {
          result.emplace(outs.front());
        } else {
          result.emplace(tree_unflatten(*result, outs));
        }
      }
      program = tr.build_program(outs, std::move(out_paths));
    }
    // The caller gets Arrays without the trace's ids.
    R clean = *result;
    if constexpr (std::is_same_v<R, Array>) {
      detail::clear_trace_id(clean);
    } else if constexpr (tree_detail::has_leaves_v<R>) {
      tree_visit(clean, [](auto& leaf, const std::string&) { detail::clear_trace_id(leaf); });
    }
    // The entry keeps the result's structure only: its leaves' blocks would keep the first
    // call's results alive (and a later call that donates them could not reuse their buffers).
    R like = clean;
    if constexpr (std::is_same_v<R, Array>) {
      like = Array();
    } else {
      jit_detail::clear_leaves(like);
    }
    auto entry = std::make_shared<Entry>(
        Entry{program, std::any(std::move(like)), std::any(Statics{static_of(args)...})});
    {
      std::lock_guard<std::mutex> lock(cache_->mu);
      cache_->entries.emplace(call.key, entry);
      ++cache_->traces;
    }
    return {entry, clean};
  }

  void constrain_outputs(std::vector<Array>& outs, const std::vector<std::string>& paths) const {
    const auto& o = options_.out_shardings;
    if (o.empty()) return;
    if (o.size() != 1 && o.size() != outs.size()) {
      throw Error(jit_detail::msg("[jit] out_shardings has ", o.size(),
                                  " entries but the function returns ", outs.size(),
                                  " Array leaves; give one per leaf (tree_visit order) or one for "
                                  "all"));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      const std::optional<Sharding>& s = o.size() == 1 ? o.front() : o[i];
      if (!s) continue;
      if (!s->same_mesh(outs[i].sharding())) {
        throw Error(jit_detail::msg("[jit] out_shardings for ", paths[i], " is ", s->str(),
                                    " but the result lives on ", outs[i].sharding().str(),
                                    "; out_shardings must be on the result's mesh"));
      }
      const NamedSharding named = *s->as_named();  // same_mesh: a NamedSharding
      const PartitionSpec& spec = named.spec();
      for (size_t d = 0; d < spec.size() && d < outs[i].shape().size(); ++d) {
        int64_t n = 1;
        for (const std::string& a : spec[d]) n *= named.mesh().axis_size(a);
        if (outs[i].shape()[d] % n != 0) {
          throw Error(jit_detail::msg("[jit] out_shardings for ", paths[i], " is ", spec.str(),
                                      " which does not divide the result's shape ",
                                      shape_str(outs[i].shape()), " (dimension ", d, ")"));
        }
      }
      outs[i] = with_sharding_constraint(outs[i], *s);
    }
  }

  F f_;
  JitOptions options_;
  std::shared_ptr<Cache> cache_;
};

// jit(f, options): f traced once per signature and replayed (see the file comment).
template <class F>
Jitted<std::decay_t<F>> jit(F&& f, JitOptions options = {}) {
  return Jitted<std::decay_t<F>>(std::forward<F>(f), std::move(options));
}

}  // namespace meshrt
