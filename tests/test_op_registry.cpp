// The op registry: every op has one definition with a shape rule, a placement rule, a derivative
// decision that agrees with autodiff's rule table, and the attributes its reports carry; the
// shared shape rules give one error text.
#include <gtest/gtest.h>

#include <set>
#include <span>
#include <string>
#include <vector>

#include "autodiff/tape.h"
#include "runtime/detail/op_registry.h"
#include "runtime/detail/trace.h"
#include "tests/test_util.h"

namespace meshrt {
namespace {

using detail::Derivative;
using detail::OpDef;
using detail::OpId;
using detail::Placement;
using detail::ShapeRule;

TEST(OpRegistry, EveryOpIdHasOneDefinitionInOrderWithAUniqueName) {
  ASSERT_EQ(detail::op_defs().size(), detail::kOpCount);
  std::set<std::string> names;
  for (size_t i = 0; i < detail::kOpCount; ++i) {
    const OpDef& def = detail::op_def(static_cast<OpId>(i));
    EXPECT_EQ(static_cast<size_t>(def.id), i) << def.name;
    EXPECT_FALSE(def.name.empty()) << "op " << i;
    EXPECT_TRUE(names.insert(std::string(def.name)).second) << def.name << " is named twice";
    EXPECT_TRUE(def.on_tensor || def.on_array)
        << def.name << " has neither a Tensor nor an Array form";
    EXPECT_LT(def.attrs, std::variant_size_v<detail::OpAttrs>) << def.name;
  }
}

// The registry's promise: no op without a shape rule, a placement rule and a derivative decision.
TEST(OpRegistry, EveryOpHasAShapeRuleAPlacementRuleAndADerivativeDecision) {
  for (const OpDef& def : detail::op_defs()) {
    EXPECT_NE(def.shape, ShapeRule::unset) << def.name << " has no shape rule";
    EXPECT_NE(def.placement, Placement::unset) << def.name << " has no placement rule";
    EXPECT_NE(def.derivative, Derivative::unset) << def.name << " has no derivative decision";
  }
}

// A `rule` decision is a rule in autodiff/rules.cpp for each form the op has; every other decision
// (zero, none as JAX, shard_map's pullback) is the absence of one, so a rule cannot be dropped or
// added without the table saying so.
TEST(OpRegistry, DerivativeDecisionsAgreeWithTheRuleTable) {
  for (const OpDef& def : detail::op_defs()) {
    const bool tensor_rule = autodiff::find_rule<Tensor>(def.id) != nullptr;
    const bool array_rule = autodiff::find_rule<Array>(def.id) != nullptr;
    if (def.derivative == Derivative::rule) {
      if (def.on_tensor) EXPECT_TRUE(tensor_rule) << def.name << " lacks its Tensor rule";
      if (def.on_array) EXPECT_TRUE(array_rule) << def.name << " lacks its Array rule";
    } else {
      EXPECT_FALSE(tensor_rule || array_rule)
          << def.name << " has a derivative rule but its decision says it has none";
    }
    if (tensor_rule) EXPECT_EQ(autodiff::find_rule<Tensor>(def.id)->op, def.id) << def.name;
    if (array_rule) EXPECT_EQ(autodiff::find_rule<Array>(def.id)->op, def.id) << def.name;
  }
  // JAX defines no derivative for pmax/pmin; bool and integer results get zero gradients.
  EXPECT_EQ(detail::op_def(OpId::pmax).derivative, Derivative::none);
  EXPECT_EQ(detail::op_def(OpId::pmin).derivative, Derivative::none);
  EXPECT_EQ(detail::op_def(OpId::argmax).derivative, Derivative::zero);
}

TEST(OpRegistry, CollectivesAndKernelsAreConsistent) {
  for (const OpDef& def : detail::op_defs()) {
    EXPECT_EQ(def.collective, def.placement == Placement::body_only) << def.name;
    if (def.reduces_axes) EXPECT_TRUE(def.collective) << def.name;
    if (def.collective) {
      EXPECT_TRUE(def.on_tensor && !def.on_array) << def.name << ": collectives run in bodies";
    }
    // Comparisons give bool: never differentiated, never linear.
    if (const auto* op = std::get_if<backend::BinaryOp>(&def.kernel)) {
      EXPECT_EQ(backend::is_comparison(*op), def.derivative == Derivative::zero) << def.name;
      if (backend::is_comparison(*op)) EXPECT_FALSE(def.linear) << def.name;
    }
    // Pending sums pass only through placement rules that carry them.
    if (def.linear) {
      EXPECT_TRUE(def.placement == Placement::elementwise || def.placement == Placement::reduce ||
                  def.placement == Placement::transpose || def.placement == Placement::reshape ||
                  def.placement == Placement::passthrough)
          << def.name;
    }
  }
  EXPECT_EQ(detail::collective_axes(detail::GatherAttrs{{"i", "j"}, 0, true}),
            (std::vector<std::string>{"i", "j"}));
  EXPECT_TRUE(detail::collective_axes(detail::SliceAttrs{}).empty());
}

// Records what each reported op carries, to check it against its definition.
class Recorder final : public detail::Tracer {
 public:
  void record(OpId op, std::span<const Tensor* const>, std::span<Tensor>,
              const detail::OpAttrs& attrs) override {
    seen.emplace_back(op, attrs.index());
  }
  void record(OpId op, std::span<const Array* const>, std::span<Array>,
              const detail::OpAttrs& attrs) override {
    seen.emplace_back(op, attrs.index());
  }
  void check_read(uint64_t, std::string_view) override {}
  std::optional<std::vector<Array>> shard_map(detail::RunShardMap, const detail::ErasedBody&,
                                              const Mesh&, const std::vector<PartitionSpec>&,
                                              const std::vector<PartitionSpec>&,
                                              const std::vector<Array>&,
                                              const ShardMapOptions&) override {
    return std::nullopt;
  }
  std::vector<std::pair<OpId, size_t>> seen;
};

TEST(OpRegistry, ReportedOpsCarryTheAttributesTheirDefinitionNames) {
  Recorder rec;
  detail::TraceState state;
  state.tracers.push_back(&rec);
  detail::TraceState* previous = detail::set_trace_state(&state);
  const Device d = devices()[0];
  const Tensor x = arange(6, DType::f32, d), m = reshape(x, {2, 3});
  (void)add(x, x), (void)multiply(x, 2.0), (void)subtract(1.0, x), (void)less(x, 3.0);
  (void)exp(x), (void)sum(m, 0), (void)softmax(m), (void)matmul(m, transpose(m));
  (void)matmul_transposed(m, m, false, true), (void)slice(x, {1}, {4}), (void)pad(x, {{1, 2}});
  (void)concatenate({x, x}), (void)m[1], (void)dynamic_update_slice(x, x, {0});
  (void)astype(x, DType::f64), (void)where(x > 1.0, x, x);
  detail::set_trace_state(previous);
  std::set<OpId> ops;
  for (const auto& [op, attrs] : rec.seen) {
    ops.insert(op);
    EXPECT_EQ(attrs, detail::op_def(op).attrs)
        << detail::op_name(op) << " carries other attributes";
    EXPECT_TRUE(detail::op_def(op).on_tensor) << detail::op_name(op);
  }
  for (OpId op : {OpId::add, OpId::mul_scalar, OpId::rsub_scalar, OpId::less_scalar, OpId::exp,
                  OpId::sum, OpId::softmax, OpId::matmul, OpId::matmul_transposed, OpId::slice,
                  OpId::pad, OpId::concatenate, OpId::row, OpId::dynamic_update_slice, OpId::astype,
                  OpId::where, OpId::transpose, OpId::reshape}) {
    EXPECT_TRUE(ops.count(op)) << detail::op_name(op) << " was not reported";
  }
}

// The shape rules Tensor ops, Array ops and the placement rules share, and their one error text.
TEST(OpRegistry, SharedShapeRules) {
  EXPECT_EQ(detail::broadcast_shapes({2, 1, 3}, {4, 1}, "[t] "), (Shape{2, 4, 3}));
  const Shape three[] = {{3}, {2, 1}, {}};
  EXPECT_EQ(detail::broadcast_shapes(three, "[t] "), (Shape{2, 3}));
  EXPECT_MESHRT_ERROR(detail::broadcast_shapes({2, 3}, {4, 3}, "[ops] add: "),
                      "[ops] add: shapes (2, 3) and (4, 3) are not broadcastable (dimension 0: 2 "
                      "vs 4)");
  const Shape bad[] = {{8, 4}, {1}, {3}};
  EXPECT_MESHRT_ERROR(detail::broadcast_shapes(bad, "[where] "),
                      "[where] shapes (8, 4), (1,) and (3,) are not broadcastable (dimension 1: 4 "
                      "vs 3)");

  EXPECT_EQ(detail::matmul_shape({5, 2, 3}, {3, 4}, false, false, "matmul", "").out,
            (Shape{5, 2, 4}));
  EXPECT_EQ(detail::matmul_shape({3}, {3, 4}, false, false, "matmul", "").out, (Shape{4}));
  EXPECT_EQ(detail::matmul_shape({2, 3}, {3}, false, false, "matmul", "").out, (Shape{2}));
  EXPECT_EQ(detail::matmul_shape({3}, {3}, false, false, "matmul", "").out, (Shape{}));
  const detail::MatmulShape t = detail::matmul_shape({1, 3, 2}, {6, 4, 3}, true, true, "mt", "");
  EXPECT_EQ(t.out, (Shape{6, 2, 4}));
  EXPECT_EQ(t.batch, (Shape{6}));
  EXPECT_EQ(t.k, 3);
  EXPECT_MESHRT_ERROR(detail::matmul_shape({8, 4}, {8, 4}, false, false, "matmul", "[matmul] "),
                      "[matmul] shapes (8, 4) and (8, 4) do not align: matmul contracts the first "
                      "operand's last dimension (size 4) with the second's second-to-last "
                      "dimension (size 8)");
  EXPECT_MESHRT_ERROR(detail::matmul_shape({2, 2, 3}, {3, 3, 4}, false, false, "matmul", "[m] "),
                      "[m] batch dimensions: shapes (2,) and (3,) are not broadcastable");
  EXPECT_MESHRT_ERROR(detail::matmul_shape({}, {3}, false, false, "matmul", "[m] "),
                      "at least 1-D");
  EXPECT_MESHRT_ERROR(detail::matmul_shape({3}, {3, 2}, true, false, "mt", "[m] "),
                      "a transposed operand must be at least 2-D");

  EXPECT_EQ(detail::reduce_shape({2, 3, 4}, 1, false), (Shape{2, 4}));
  EXPECT_EQ(detail::reduce_shape({2, 3, 4}, 1, true), (Shape{2, 1, 4}));
  EXPECT_EQ(detail::reduce_shape({2, 3, 4}, std::nullopt, true), (Shape{1, 1, 1}));
}

}  // namespace
}  // namespace meshrt
