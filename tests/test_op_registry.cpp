// The op registry: every op has one definition with a shape rule, a placement rule, a derivative
// decision that agrees with autodiff's rule table, and the attributes its reports carry; the
// shared shape rules give one error text.
#include <gtest/gtest.h>

#include <optional>
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
    // An op with a Tensor and an Array form takes its shape rule from here, so the two forms
    // cannot drift apart (same has nothing to check).
    if (def.on_tensor && def.on_array && def.shape != ShapeRule::same) {
      EXPECT_TRUE(detail::shape_rule_shared(def.shape))
          << def.name << " has a Tensor and an Array form but no shared shape rule";
    }
  }
  // The Array-only ops whose rule is shared with the Tensor ops they are made of.
  for (OpId op : {OpId::mean, OpId::stack, OpId::split}) {
    EXPECT_TRUE(detail::shape_rule_shared(detail::op_def(op).shape))
        << detail::op_name(op) << " has no shared shape rule";
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
  std::optional<detail::TraceScope> on(std::in_place, rec);
  const Device d = devices()[0];
  const Tensor x = arange(6, DType::f32, d), m = reshape(x, {2, 3});
  (void)add(x, x), (void)multiply(x, 2.0), (void)subtract(1.0, x), (void)less(x, 3.0);
  (void)exp(x), (void)sum(m, 0), (void)softmax(m), (void)matmul(m, transpose(m));
  (void)matmul_transposed(m, m, false, true), (void)slice(x, {1}, {4}), (void)pad(x, {{1, 2}});
  (void)concatenate({x, x}), (void)m[1], (void)dynamic_update_slice(x, x, {0});
  (void)astype(x, DType::f64), (void)where(x > 1.0, x, x);
  on.reset();
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

// TraceScope is the one way tracing starts and ends: scopes nest (an inner tracer joins the outer
// ones, `none` hides every tracer, a jit scope stands alone) and each puts back what it found,
// when an exception leaves it too; a traced op's inner ops are never reported.
TEST(OpRegistry, TraceScopesNestAndRestoreWhatTheyFound) {
  const Device d = devices()[0];
  const Tensor x = arange(4, DType::f32, d);
  ASSERT_EQ(detail::trace_state(), nullptr);
  Recorder outer, inner, jit;
  {
    detail::TraceScope a(outer);
    EXPECT_TRUE(detail::tracing());
    (void)exp(x);
    {
      detail::TraceScope b(inner);
      EXPECT_EQ(detail::trace_state()->tracers.size(), 2u);
      (void)neg(x);
      {
        detail::TraceScope off(detail::TraceScope::none);
        EXPECT_FALSE(detail::tracing());
        (void)log(x);
      }
      {
        detail::TraceScope j(detail::TraceScope::jit, jit);
        EXPECT_TRUE(detail::trace_state()->jit);
        EXPECT_EQ(detail::trace_state()->tracers.size(), 1u);
        (void)sin(x);
      }
      EXPECT_FALSE(detail::trace_state()->jit);
      (void)softmax(x);  // made of other ops: reported once, as itself
    }
    EXPECT_EQ(detail::trace_state()->tracers.size(), 1u);
    EXPECT_THROW(
        {
          detail::TraceScope b(inner);
          (void)cos(x);
          throw Error("[test] leaves the scope");
        },
        Error);
    EXPECT_EQ(detail::trace_state()->tracers.size(), 1u);
  }
  EXPECT_EQ(detail::trace_state(), nullptr);
  EXPECT_FALSE(detail::tracing());
  auto ops = [](const Recorder& r) {
    std::vector<OpId> v;
    for (const auto& [op, attrs] : r.seen) v.push_back(op);
    return v;
  };
  EXPECT_EQ(ops(outer), (std::vector<OpId>{OpId::exp, OpId::neg, OpId::softmax, OpId::cos}));
  EXPECT_EQ(ops(inner), (std::vector<OpId>{OpId::neg, OpId::softmax, OpId::cos}));
  EXPECT_EQ(ops(jit), (std::vector<OpId>{OpId::sin}));
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

// Axis normalisation, transpose, slice, pad, reshape, concatenate/stack and split: one check
// each, in the wording of the form that calls it (the Tensor ops' "[ops] op: ", the Array ops'
// "[op] ", which the collectives share).
TEST(OpRegistry, SharedShapeRulesForShapeOps) {
  using detail::Form;
  EXPECT_EQ(detail::normalize_axis(-1, 3, "sum", {2, 3, 4}, Form::tensor), 2);
  EXPECT_EQ(detail::normalize_axis(-3, 3, "stack", {2, 3}, Form::array), 0);
  EXPECT_EQ(detail::normalize_axis(1, 2, "sum", {2, 3}, Form::array), 1);
  EXPECT_MESHRT_ERROR(detail::normalize_axis(-3, 2, "sum", {2, 3}, Form::tensor),
                      "[ops] sum: axis -3 is out of bounds for an array of shape (2, 3) (rank 2)");
  EXPECT_MESHRT_ERROR(detail::normalize_axis(2, 2, "sum", {2, 3}, Form::array),
                      "[sum] axis 2 is out of bounds for array of dimension 2");
  EXPECT_MESHRT_ERROR(detail::normalize_axis(0, 0, "all_gather", {}, Form::array),
                      "[all_gather] axis 0 is out of bounds for array of dimension 0");

  std::vector<int> perm;
  EXPECT_EQ(detail::permute_shape({2, 3, 4}, perm, Form::tensor), (Shape{4, 3, 2}));
  EXPECT_EQ(perm, (std::vector<int>{2, 1, 0}));
  perm = {-1, 0, 1};
  EXPECT_EQ(detail::permute_shape({2, 3, 4}, perm, Form::array), (Shape{4, 2, 3}));
  EXPECT_EQ(perm, (std::vector<int>{2, 0, 1}));
  perm = {};
  EXPECT_EQ(detail::permute_shape({}, perm, Form::array), (Shape{}));
  perm = {0, -2};
  EXPECT_MESHRT_ERROR(detail::permute_shape({2, 3}, perm, Form::tensor),
                      "[ops] transpose: permutation 0, 0 is not a permutation of the 2 axes of "
                      "shape (2, 3)");
  perm = {-1, 2};
  EXPECT_MESHRT_ERROR(detail::permute_shape({2, 3}, perm, Form::tensor),
                      "[ops] transpose: permutation 1, 2 is not a permutation of the 2 axes of "
                      "shape (2, 3)");
  perm = {0};
  EXPECT_MESHRT_ERROR(detail::permute_shape({2, 3}, perm, Form::array),
                      "[transpose] axes don't match array: a permutation of 2 axes is needed");
  perm = {1, 1};
  EXPECT_MESHRT_ERROR(detail::permute_shape({2, 3}, perm, Form::array),
                      "[transpose] axes don't match array: a permutation of 2 axes is needed");

  EXPECT_EQ(detail::slice_shape({5, 6}, {1, 0}, {4, 6}, {}, Form::tensor), (Shape{3, 6}));
  EXPECT_EQ(detail::slice_shape({5, 6}, {1, 0}, {5, 6}, {2, 4}, Form::array), (Shape{2, 2}));
  EXPECT_MESHRT_ERROR(detail::slice_shape({5, 6}, {0}, {1}, {}, Form::tensor),
                      "[ops] slice: start (0,), limit (1,) (and strides) need one entry per "
                      "dimension of (5, 6)");
  EXPECT_MESHRT_ERROR(detail::slice_shape({5, 6}, {0}, {1}, {}, Form::array),
                      "[slice] start, limit and strides need one entry per dimension of (5, 6)");
  EXPECT_MESHRT_ERROR(detail::slice_shape({5, 6}, {0, 0}, {6, 6}, {1, 1}, Form::tensor),
                      "[ops] slice: start (0, 0), limit (6, 6) and strides (1, 1) do not fit "
                      "shape (5, 6) (need 0 <= start <= limit <= dim, stride >= 1)");
  EXPECT_MESHRT_ERROR(detail::slice_shape({5, 6}, {0, 0}, {5, 6}, {1, 0}, Form::array),
                      "[slice] start (0, 0), limit (5, 6) do not fit shape (5, 6)");

  const std::vector<std::pair<int64_t, int64_t>> widths = {{1, 2}, {0, 3}};
  EXPECT_EQ(detail::pad_shape({2, 3}, widths, Form::array), (Shape{5, 6}));
  EXPECT_MESHRT_ERROR(detail::pad_shape({2}, widths, Form::tensor),
                      "[ops] pad: 2 (before, after) pairs given for shape (2,); give one per "
                      "dimension");
  EXPECT_MESHRT_ERROR(detail::pad_shape({2}, widths, Form::array),
                      "[pad] widths need one (before, after) pair per dimension of (2,)");
  const std::vector<std::pair<int64_t, int64_t>> negative = {{1, -1}};
  EXPECT_MESHRT_ERROR(detail::pad_shape({2}, negative, Form::tensor),
                      "[ops] pad: widths must be >= 0, got (1, -1) for dimension 0");
  EXPECT_MESHRT_ERROR(detail::pad_shape({2}, negative, Form::array), "[pad] widths must be >= 0");

  EXPECT_EQ(detail::reshape_shape({4, 6}, {-1, 3}, "reshape", Form::tensor), (Shape{8, 3}));
  EXPECT_EQ(detail::reshape_shape({4, 6}, {2, -1, 4}, "reshape", Form::array), (Shape{2, 3, 4}));
  EXPECT_MESHRT_ERROR(detail::reshape_shape({24}, {-1, -1}, "reshape", Form::tensor),
                      "[ops] reshape: only one dimension may be -1, got (-1, -1)");
  EXPECT_MESHRT_ERROR(detail::reshape_shape({24}, {-2, 12}, "reshape", Form::tensor),
                      "[ops] reshape: negative dimension in (-2, 12)");
  EXPECT_MESHRT_ERROR(detail::reshape_shape({24}, {7, -1}, "reshape", Form::tensor),
                      "[ops] reshape: cannot reshape (24,) into (7, -1)");
  EXPECT_MESHRT_ERROR(detail::reshape_shape({24}, {5, 5}, "reshape", Form::tensor),
                      "[ops] reshape: cannot reshape an array of shape (24,) (24 elements) into "
                      "shape (5, 5) (25 elements)");
  EXPECT_MESHRT_ERROR(detail::reshape_shape({8, 4}, {5, 7}, "squeeze", Form::array),
                      "[squeeze] cannot reshape array of shape (8, 4) (size 32) into shape (5, 7) "
                      "(size 35)");
  EXPECT_MESHRT_ERROR(detail::reshape_shape({24}, {7, -1}, "reshape", Form::array),
                      "[reshape] cannot reshape array of shape (24,) (size 24) into shape (7, -1) "
                      "(size -7)");

  const Shape two[] = {{2, 3}, {2, 4}};
  EXPECT_EQ(detail::join_shape(two, 1, false, Form::tensor), (Shape{2, 7}));
  const Shape same[] = {{2, 3}, {2, 3}, {2, 3}};
  EXPECT_EQ(detail::join_shape(same, 1, true, Form::array), (Shape{2, 3, 3}));
  EXPECT_MESHRT_ERROR(detail::join_shape(two, 0, false, Form::tensor),
                      "[ops] concatenate: shapes (2, 3) and (2, 4) differ outside axis 0");
  EXPECT_MESHRT_ERROR(detail::join_shape(two, 0, false, Form::array),
                      "[concatenate] all input arrays must have the same shape except along axis; "
                      "got (2, 3) and (2, 4)");
  EXPECT_MESHRT_ERROR(detail::join_shape(two, 0, true, Form::tensor),
                      "[ops] stack: all input arrays must have the same shape, got (2, 3) and "
                      "(2, 4)");
  EXPECT_MESHRT_ERROR(detail::join_shape(two, 0, true, Form::array),
                      "[stack] all input arrays must have the same shape; got (2, 3) and (2, 4)");

  EXPECT_EQ(detail::split_shape({6, 4}, 3, 0, Form::tensor), (Shape{2, 4}));
  EXPECT_MESHRT_ERROR(detail::split_shape({6, 4}, 3, 1, Form::tensor),
                      "[ops] split: array split does not result in an equal division: dimension 1 "
                      "of shape (6, 4) (size 4) into 3 sections");
  EXPECT_MESHRT_ERROR(detail::split_shape({6, 4}, 0, 1, Form::array),
                      "[split] array split does not result in an equal division: 4 into 0");
}

}  // namespace
}  // namespace meshrt
