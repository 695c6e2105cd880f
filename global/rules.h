// global/rules.h: placement rules of the global-view ops, one per op family (not installed).
// Each rule maps the operands' layouts (and shapes) to the layouts the operands must have when
// the per-device op runs (`need`) and the layouts of the results (`out`). rules.cpp holds them
// all; which op uses which is its row's Placement in runtime/detail/op_registry.cpp.
#pragma once

#include <optional>
#include <vector>

#include "global/layout.h"

namespace meshrt::global {

struct Plan {
  std::vector<Layout> need;  // per operand
  std::vector<Layout> out;   // per result
  // Axes of a max/min reduction to combine with pmax/pmin after the local reduction.
  AxisList reduce_axes;
};

struct Operand {
  const Shape* shape;
  Layout layout;
};

// Elementwise with NumPy broadcasting. `linear` (the op's OpDef::linear): the op keeps pending
// sums when every operand has the same ones (+, -, negation, multiplication or division by a
// scalar).
Plan elementwise_rule(const Mesh& mesh, const std::vector<Operand>& xs, const Shape& out_shape,
                      bool linear);
// Reductions over `axis` (nullopt: all). sum/mean leave a pending sum over the reduced dims'
// axes; max/min combine with pmax/pmin; argmax gathers the reduced dims first.
enum class Reduction { sum, mean, max, min, argmax };
Plan reduce_rule(const Mesh& mesh, const Operand& x, Reduction kind, std::optional<int> axis,
                 bool keepdims);
// The operand's dimensions `whole` gathered (unsharded), the rest kept: softmax along an axis,
// slices of sharded dims, pad, the concat/split dimension. The result gets the operand's
// layout on the kept dims, and on the others what divides the result's size (JAX's rule).
Plan gather_dims_rule(const Mesh& mesh, const Operand& x, const std::vector<bool>& whole,
                      const Shape& out_shape);
// matmul/dot: (..., m, k) @ (..., k, n), 1-D operands promoted as jnp.matmul does.
Plan matmul_rule(const Mesh& mesh, const Operand& a, const Operand& b);
// A placement of a 2-D matmul that moves fewer bytes than `jax` (matmul_rule's, jax.jit's),
// computed in another layout and then resharded to `jax.out` (so results, shardings and pending
// sums are what matmul_rule promises; only the way there differs):
//   rows:    the contraction's mesh axes moved onto the lhs rows (all_to_all), the rhs replicated
//            over them (all_gather): no partial products, and each device multiplies a block of
//            whole rows. The tensor-parallel MLP's x @ W with x P(None, 'x') and W P('x', None)
//            writes a (batch, n) partial product per device otherwise; there the rule's result
//            is a pending sum, and the rows become a deferred one (`deferred`), priced as moved
//            once more (an all_to_all into a sharded layout) when it is taken.
//   split_k: axes splitting both the lhs rows and the rhs columns (one of them gathered by the
//            rule) moved onto the contraction of both (all_to_all): a partial product of the
//            small result, summed into jax.out (psum_scatter). Also, where an operand is kept
//            in another layout (`kept`) and jax.out is no pending sum, onto one operand's
//            contraction axes, the other's contraction moved there.
//   in place: the rule applied to where the operands are, when jax.out is no pending sum; it
//            differs from `jax` only when an operand is kept in another layout than its sharding
//            shows (the caller passes that layout: a product kept as rows, global/array_ops.cpp).
//            The tensor-parallel MLP's weight gradient a.T @ dz with both kept as rows is then a
//            partial product summed into jax.out, and dz @ W.T gathers only W.
// `a` and `b` carry where the operands are; `jax` is the rule's plan for the layouts their
// shardings show, priced from where they are.
// Costs are the elements each device writes into new blocks (moved operands, the product, a
// partial product's sum) plus 16 Ki elements per collective (its fixed cost); an alternative
// is taken below 3/4 of the rule's cost.
struct MatmulChoice {
  Plan plan;         // need: per operand; out: the layout the product is computed in
  const char* form;  // "rows", "split_k" or "in place"
  int64_t cost = 0;  // per device, elements
  int64_t jax_cost = 0;
  // jax.out is a pending sum and plan.out its summed value in rows: the result is a deferred
  // pending sum (its sum moved from the rows when taken, its addends made only if read).
  bool deferred = false;
};
// `kept`: an operand is kept in another layout than its sharding shows (then split_k onto one
// operand's contraction axes is considered too).
std::optional<MatmulChoice> cheaper_matmul(const Mesh& mesh, const Operand& a, const Operand& b,
                                           const Plan& jax, bool kept = false);
Plan transpose_rule(const Operand& x, const std::vector<int>& perm);
Plan reshape_rule(const Mesh& mesh, const Operand& x, const Shape& out_shape);
// concatenate / stack along `axis` (stack: a new unsharded dimension at `axis`).
Plan join_rule(const Mesh& mesh, const std::vector<Operand>& xs, int axis, bool stack,
               const Shape& out_shape);

}  // namespace meshrt::global
