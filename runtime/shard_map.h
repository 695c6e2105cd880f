// runtime/shard_map.h: run a per-device body over a mesh, with JAX's collectives.
//
//   auto f = shard_map(
//       [](Context& ctx, const Tensor& x) { return ctx.psum(x, "data"); },
//       mesh, {P("data")}, P());
//   Array total = f(x);
//
// The body runs once per mesh device, concurrently, on that device's executor. Inputs are
// resharded to in_specs (same platform) and each device sees its block. Outputs are assembled
// per out_specs: each dimension of the global result is the block's times the sizes of the mesh
// axes its spec entry names, and each device's block lands where NamedSharding(mesh, out_spec)
// places that device. An out_spec that leaves out a mesh axis promises the output is equal along
// it (one copy is kept): checked at run time (ShardMapOptions::check_replication).
//
// Collectives follow JAX exactly (groups, in-group order, shapes, zeros for ppermute). Misuse is
// an Error, never a hang: mismatched calls, a device leaving while peers wait, or a wait-for
// cycle are reported at once; MESHRT_COLLECTIVE_TIMEOUT (seconds, default 300) catches bodies
// stuck in user code. One shard_map runs at a time per process; calls from several threads are
// serialised, and calling shard_map inside a body is an Error.
//
// out_specs: a PartitionSpec for a body returning one Tensor; for a body returning
// std::vector<Tensor>, a std::vector<PartitionSpec> or a braced list, {P("x"), P()} (a braced list
// follows the body: {P("x")} is one output of a Tensor body, a one-entry list of a list body).
// Errors name the body as JAX names the function: ShardMapOptions{.name = "loss"}, else the
// body's type shortened (a functor's class name, "<lambda in main>" for a lambda in main).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "runtime/array.h"
#include "runtime/context.h"
#include "runtime/mesh.h"
#include "runtime/partition_spec.h"
#include "runtime/tensor.h"

namespace meshrt {

// Options of shard_map (beyond JAX's mesh, in_specs and out_specs).
struct ShardMapOptions {
  // Check at run time that outputs are equal along the mesh axes their out_spec leaves out
  // (JAX's check_vma, done on values). Off: the first device's block (mesh order) is used.
  bool check_replication = true;
  // The body's name in errors ("shard_map applied to the function 'loss' ..."), as JAX uses the
  // function's __name__. Empty: the body's type name, shortened ("Loss" for a functor class,
  // "<lambda in main>"; "body" for a function pointer or std::function, whose type has no name).
  std::string name = {};
};

namespace detail {
using ErasedBody = std::function<std::vector<Tensor>(Context&, const std::vector<Tensor>&)>;
std::vector<Array> run_shard_map(const ErasedBody& body, const Mesh& mesh,
                                 const std::vector<PartitionSpec>& in_specs,
                                 const std::vector<PartitionSpec>& out_specs,
                                 const std::vector<Array>& args, const ShardMapOptions& options);

// A demangled type name shortened to what a user calls the function (see ShardMapOptions::name).
std::string body_type_name(const std::type_info& type);
// The error for a braced out_specs list of `count` entries given with a body returning one Tensor.
[[noreturn]] void throw_single_output_braced(size_t count, const ShardMapOptions& options);

template <class Body>
ShardMapOptions with_name(ShardMapOptions options) {
  if (options.name.empty()) options.name = body_type_name(typeid(Body));
  return options;
}

template <class Body, size_t... I>
auto invoke_body(const Body& body, Context& ctx, const std::vector<Tensor>& xs,
                 std::index_sequence<I...>) {
  return body(ctx, xs[I]...);
}

// How out_specs were given: one PartitionSpec, a std::vector, or a braced list (which follows
// what the body returns).
enum class OutForm { single, list, braced };
}  // namespace detail

// The callable shard_map returns: takes one Array per in_spec.
template <class Body, detail::OutForm kForm>
class ShardMapped {
 public:
  // Holds the body and its specs; nothing is checked or run until the call. Use shard_map().
  ShardMapped(Body body, Mesh mesh, std::vector<PartitionSpec> in_specs,
              std::vector<PartitionSpec> out_specs, ShardMapOptions options)
      : body_(std::move(body)),
        mesh_(std::move(mesh)),
        in_specs_(std::move(in_specs)),
        out_specs_(std::move(out_specs)),
        options_(std::move(options)) {}

  // Bodies over a list of blocks (JAX's pytree of arrays): body(Context&, const
  // std::vector<Tensor>&) returning std::vector<Tensor>, called with one Array per in_spec.
  std::vector<Array> operator()(
      const std::vector<Array>& args) const requires std::is_invocable_r_v < std::vector<Tensor>,
  const Body&, Context&, const std::vector<Tensor>& > {
    static_assert(kForm != detail::OutForm::single,
                  "a list body returns std::vector<Tensor>: give out_specs as a vector");
    const Body& body = body_;
    detail::ErasedBody erased = [&body](Context& ctx, const std::vector<Tensor>& xs) {
      return body(ctx, xs);
    };
    return detail::run_shard_map(erased, mesh_, in_specs_, out_specs_, args, options_);
  }

  // Bodies over separate blocks: body(Context&, const Tensor&...) called with one Array per
  // in_spec; returns an Array for a Tensor body, std::vector<Array> for a vector body. Errors in
  // the specs or in a body are thrown here, naming the body (ShardMapOptions::name).
  template <class... A>
  requires(std::is_same_v<A, Array>&&...) auto operator()(const A&... args) const {
    static_assert((std::is_same_v<A, Array> && ...), "shard_map arguments are meshrt::Arrays");
    constexpr size_t n = sizeof...(A);
    using R = decltype(detail::invoke_body(body_, std::declval<Context&>(),
                                           std::declval<const std::vector<Tensor>&>(),
                                           std::make_index_sequence<n>{}));
    if constexpr (kForm == detail::OutForm::single) {
      static_assert(std::is_same_v<R, Tensor>,
                    "with a single PartitionSpec as out_specs the body returns a Tensor");
    } else if constexpr (kForm == detail::OutForm::list) {
      static_assert(std::is_same_v<R, std::vector<Tensor>>,
                    "with a vector of out_specs the body returns std::vector<Tensor>");
    } else {
      static_assert(std::is_same_v<R, Tensor> || std::is_same_v<R, std::vector<Tensor>>,
                    "a shard_map body returns a Tensor or a std::vector<Tensor>");
    }
    constexpr bool single = std::is_same_v<R, Tensor>;
    if constexpr (single && kForm == detail::OutForm::braced) {
      if (out_specs_.size() != 1) detail::throw_single_output_braced(out_specs_.size(), options_);
    }
    const Body& body = body_;
    detail::ErasedBody erased = [&body](Context& ctx, const std::vector<Tensor>& xs) {
      if constexpr (single) {
        return std::vector<Tensor>{
            detail::invoke_body(body, ctx, xs, std::make_index_sequence<n>{})};
      } else {
        return detail::invoke_body(body, ctx, xs, std::make_index_sequence<n>{});
      }
    };
    std::vector<Array> out = detail::run_shard_map(erased, mesh_, in_specs_, out_specs_,
                                                   std::vector<Array>{args...}, options_);
    if constexpr (single) {
      return out.front();
    } else {
      return out;
    }
  }

 private:
  Body body_;
  Mesh mesh_;
  std::vector<PartitionSpec> in_specs_;
  std::vector<PartitionSpec> out_specs_;
  ShardMapOptions options_;
};

// body: Tensor(Context&, const Tensor&...) with out_specs a PartitionSpec, or
//       std::vector<Tensor>(Context&, const Tensor&...) with out_specs a vector of them.
// Specs are checked when the result is called (as in JAX).
template <class Body>
auto shard_map(Body body, Mesh mesh, std::vector<PartitionSpec> in_specs, PartitionSpec out_specs,
               ShardMapOptions options = {}) {
  return ShardMapped<Body, detail::OutForm::single>(std::move(body), std::move(mesh),
                                                    std::move(in_specs), {std::move(out_specs)},
                                                    detail::with_name<Body>(std::move(options)));
}
// The same with out_specs a vector of PartitionSpecs: the body returns std::vector<Tensor>, one
// block per out_spec, and the call returns std::vector<Array>.
template <class Body>
auto shard_map(Body body, Mesh mesh, std::vector<PartitionSpec> in_specs,
               std::vector<PartitionSpec> out_specs, ShardMapOptions options = {}) {
  return ShardMapped<Body, detail::OutForm::list>(std::move(body), std::move(mesh),
                                                  std::move(in_specs), std::move(out_specs),
                                                  detail::with_name<Body>(std::move(options)));
}
// out_specs as a braced list, {P("x"), P()} or {P("x")}: preferred over both overloads above for
// any braced list (C++ ranks a std::initializer_list parameter first), so the body's return type
// decides: a std::vector<Tensor> body gets one output per entry, a Tensor body needs one entry.
template <class Body>
auto shard_map(Body body, Mesh mesh, std::vector<PartitionSpec> in_specs,
               std::initializer_list<PartitionSpec> out_specs, ShardMapOptions options = {}) {
  return ShardMapped<Body, detail::OutForm::braced>(
      std::move(body), std::move(mesh), std::move(in_specs), std::vector<PartitionSpec>(out_specs),
      detail::with_name<Body>(std::move(options)));
}

}  // namespace meshrt
