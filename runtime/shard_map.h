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
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/array.h"
#include "runtime/context.h"
#include "runtime/mesh.h"
#include "runtime/partition_spec.h"
#include "runtime/tensor.h"

namespace meshrt {

struct ShardMapOptions {
  // Check at run time that outputs are equal along the mesh axes their out_spec leaves out
  // (JAX's check_vma, done on values). Off: the first device's block (mesh order) is used.
  bool check_replication = true;
};

namespace detail {
using ErasedBody = std::function<std::vector<Tensor>(Context&, const std::vector<Tensor>&)>;
std::vector<Array> run_shard_map(const ErasedBody& body, const Mesh& mesh,
                                 const std::vector<PartitionSpec>& in_specs,
                                 const std::vector<PartitionSpec>& out_specs,
                                 const std::vector<Array>& args, const ShardMapOptions& options);

template <class Body, size_t... I>
auto invoke_body(const Body& body, Context& ctx, const std::vector<Tensor>& xs,
                 std::index_sequence<I...>) {
  return body(ctx, xs[I]...);
}
}  // namespace detail

// The callable shard_map returns: takes one Array per in_spec.
template <class Body, bool kSingleOut>
class ShardMapped {
 public:
  ShardMapped(Body body, Mesh mesh, std::vector<PartitionSpec> in_specs,
              std::vector<PartitionSpec> out_specs, ShardMapOptions options)
      : body_(std::move(body)),
        mesh_(std::move(mesh)),
        in_specs_(std::move(in_specs)),
        out_specs_(std::move(out_specs)),
        options_(options) {}

  // Bodies over a list of blocks (JAX's pytree of arrays): body(Context&, const
  // std::vector<Tensor>&) returning std::vector<Tensor>, called with one Array per in_spec.
  std::vector<Array> operator()(
      const std::vector<Array>& args) const requires std::is_invocable_r_v < std::vector<Tensor>,
  const Body&, Context&, const std::vector<Tensor>& > {
    static_assert(!kSingleOut,
                  "a list body returns std::vector<Tensor>: give out_specs as a vector");
    const Body& body = body_;
    detail::ErasedBody erased = [&body](Context& ctx, const std::vector<Tensor>& xs) {
      return body(ctx, xs);
    };
    return detail::run_shard_map(erased, mesh_, in_specs_, out_specs_, args, options_);
  }

  template <class... A>
  requires(std::is_same_v<A, Array>&&...) auto operator()(const A&... args) const {
    static_assert((std::is_same_v<A, Array> && ...), "shard_map arguments are meshrt::Arrays");
    constexpr size_t n = sizeof...(A);
    using R = decltype(detail::invoke_body(body_, std::declval<Context&>(),
                                           std::declval<const std::vector<Tensor>&>(),
                                           std::make_index_sequence<n>{}));
    if constexpr (kSingleOut) {
      static_assert(std::is_same_v<R, Tensor>,
                    "with a single PartitionSpec as out_specs the body returns a Tensor");
    } else {
      static_assert(std::is_same_v<R, std::vector<Tensor>>,
                    "with a vector of out_specs the body returns std::vector<Tensor>");
    }
    const Body& body = body_;
    detail::ErasedBody erased = [&body](Context& ctx, const std::vector<Tensor>& xs) {
      if constexpr (kSingleOut) {
        return std::vector<Tensor>{
            detail::invoke_body(body, ctx, xs, std::make_index_sequence<n>{})};
      } else {
        return detail::invoke_body(body, ctx, xs, std::make_index_sequence<n>{});
      }
    };
    std::vector<Array> out = detail::run_shard_map(erased, mesh_, in_specs_, out_specs_,
                                                   std::vector<Array>{args...}, options_);
    if constexpr (kSingleOut) {
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
  return ShardMapped<Body, true>(std::move(body), std::move(mesh), std::move(in_specs),
                                 {std::move(out_specs)}, options);
}
template <class Body>
auto shard_map(Body body, Mesh mesh, std::vector<PartitionSpec> in_specs,
               std::vector<PartitionSpec> out_specs, ShardMapOptions options = {}) {
  return ShardMapped<Body, false>(std::move(body), std::move(mesh), std::move(in_specs),
                                  std::move(out_specs), options);
}

}  // namespace meshrt
