// The Array overloads: shapes and checks at the global level, the placement rule from
// rules.cpp, then one launch that runs the Tensor op on every device's blocks.
#include "global/array_ops.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "global/launch.h"
#include "global/layout.h"
#include "global/reshard.h"
#include "global/rules.h"
#include "global/sharding_mode.h"
#include "runtime/detail/access.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/sharding_impl.h"
#include "runtime/detail/trace.h"

namespace meshrt {

using detail::cat;
using detail::OpId;
using global::Layout;
using global::Operand;
using global::OpMesh;
using global::Plan;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

std::string shape_tuple(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += cat(i ? ", " : "", s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

Shape broadcast_shape(std::string_view op, const std::vector<const Array*>& xs) {
  std::vector<Shape> shapes;
  for (const Array* x : xs) shapes.push_back(x->shape());
  return detail::broadcast_shapes(shapes, cat("[", op, "] "));
}

std::vector<const Array*> ptrs(const std::vector<Array>& xs) {
  std::vector<const Array*> p;
  for (const Array& x : xs) p.push_back(&x);
  return p;
}

// The one path every op takes: mesh, placement, one launch per device, the final layouts
// (re-slicing where the op computed on gathered dims), back to a single device where needed.
// What runs on each device's blocks: a plain function when the op needs no collective (run
// from the caller's thread), else a body with a Context (run as a shard_map).
struct BlockFn {
  template <class F>
  BlockFn(F f) {  // NOLINT(google-explicit-constructor): every op passes a lambda
    if constexpr (std::is_invocable_v<F&, const std::vector<Tensor>&>) {
      local = std::move(f);
    } else {
      body = std::move(f);
    }
  }
  global::LocalFn local;
  global::Body body;
};

// Ops on small blocks run device after device from the caller's thread (a launch would cost
// more than the work); from this many bytes of operands per device, the devices compute
// concurrently on their executors, so every core works (one BLAS call per device at once).
constexpr size_t kConcurrentBytes = size_t{1} << 20;

bool concurrent(const Mesh& mesh, const std::vector<Array>& placed) {
  if (mesh.size() < 2) return false;
  size_t bytes = 0;
  for (const Array& a : placed) {
    for (const Tensor& b : detail::ArrayAccess::blocks(a)) {
      if (b.valid()) {
        bytes += b.nbytes();
        break;  // one device's operands
      }
    }
  }
  return bytes >= kConcurrentBytes;
}

std::vector<Array> apply(std::string_view op, const std::vector<Array>& xs, const Plan& plan,
                         const std::vector<Layout>& computed, const std::vector<Shape>& out_shapes,
                         const BlockFn& fn) {
  const OpMesh m = global::op_mesh(op, ptrs(xs));
  std::vector<Array> placed;
  for (size_t i = 0; i < xs.size(); ++i) {
    placed.push_back(global::place(global::on_mesh(xs[i], m), m.mesh, plan.need[i], op, i));
  }
  std::vector<Array> res;
  if (fn.local && !concurrent(m.mesh, placed)) {
    res = global::run_local(m.mesh, placed, computed, out_shapes, fn.local);
  } else if (fn.local) {  // large blocks: every device computes at once, on its executor
    const global::LocalFn& f = fn.local;
    res = global::run_blocks(m.mesh, placed, plan.need, computed, out_shapes,
                             [&f](Context&, const std::vector<Tensor>& b) { return f(b); },
                             {.local = &f});
  } else {
    res = global::run_blocks(m.mesh, placed, plan.need, computed, out_shapes, fn.body);
  }
  // A pending sum is named after the op that made it (kept through the linear ops that carry
  // it), so the CollectiveLog can say where a psum taken later came from.
  std::string origin;
  for (const Array& x : xs) {
    if (origin.empty()) origin = meshrt::detail::pending_sum_origin(x);
  }
  if (origin.empty()) origin = std::string(op);
  for (const Array& r : res) meshrt::detail::set_pending_sum_origin(r, origin);
  for (size_t i = 0; i < res.size(); ++i) {
    if (i < plan.out.size() && plan.out[i].dims != computed[i].dims) {
      res[i] = global::reshard(res[i], m.mesh, plan.out[i], op, /*implicit=*/false);
    }
    res[i] = global::off_mesh(res[i], m);
  }
  return res;
}

std::vector<Operand> operands(const std::vector<Array>& xs) {
  std::vector<Operand> out;
  for (const Array& x : xs) out.push_back({&x.shape(), global::layout_of(x)});
  return out;
}

bool placed_by_bytes(const Mesh& mesh);

// Values kept as rows. A matmul computed as rows (global::cheaper_matmul) leaves its product
// where it computed it: a deferred pending sum where jax.jit's result is a pending sum, else a
// value whose sharding() is jax.jit's but whose blocks are made (moved from the rows, logged
// under the op that kept it) only when something reads them there. The elementwise ops and sums
// over such values, and the matmuls taking them, compute where the rows are, so the
// tensor-parallel MLP's activations and their gradients stay in rows from one product to the
// next instead of moving to P(None, 'x') and back around every `+ b`, relu and product.
// Auto mode, host memory, every device in this process (a read in one process only must not
// move blocks between processes), MESHRT_KEEP_ROWS=1.
bool keeps_rows(const OpMesh& m) {
  if (m.single || sharding_mode() != ShardingMode::auto_ || !config::keep_rows() ||
      !placed_by_bytes(m.mesh)) {
    return false;
  }
  return std::all_of(m.mesh.devices().begin(), m.mesh.devices().end(),
                     [](const Device& d) { return d.process_index() == process_index(); });
}

// Where `x`'s value is when it is kept as rows (or a deferred pending sum's sum), else null.
const Array* rows_of(const Array& x) { return meshrt::detail::value_elsewhere(x); }

// `rows` (computed by `op` in another layout) as the value jax.jit's placement gives, laid out
// as `shown` (no pending sums): moved there when first read.
Array keep_as_rows(const Mesh& mesh, const Array& rows, const Layout& shown, std::string_view op) {
  auto move = [mesh, rows, shown, by = std::string(op)]() {
    // The global view's own move, whichever op (or jit's recorder) reads the blocks first.
    const meshrt::detail::Untraced untraced;
    return detail::ArrayAccess::blocks(
        global::reshard(rows, mesh, shown, by, /*implicit=*/false,
                        cat("kept as rows (", global::layout_str(global::layout_of(rows)), ") by ",
                            by, ", moved when read; MESHRT_KEEP_ROWS=0 moves it at ", by)));
  };
  return meshrt::detail::make_kept_in_another_layout(
      rows.shape(), rows.dtype(), NamedSharding(mesh, global::spec_of(shown)), rows, move);
}

// An elementwise op over values kept as rows, computed in their rows (the other operands brought
// there) and kept as rows: the tensor-parallel MLP's `+ b` and relu, and relu's gradient
// `where(a > 0, g, 0)` (g moved to the rows once, where its mask would move otherwise, and every
// product after it would move g again). Null where an operand kept as rows is broadcast or the
// operands' rows differ, where the other operands have more elements than those kept as rows
// (operands of less than a device's share of the result do not count), or where jax.jit's
// result is a pending sum.
std::optional<Array> elementwise_in_rows(std::string_view op, OpId id, const std::vector<Array>& xs,
                                         const Shape& out, const OpMesh& m, const Plan& jax,
                                         const global::LocalFn& fn) {
  if (!jax.out.front().partial.empty() || !keeps_rows(m)) return std::nullopt;
  std::optional<Layout> rows;
  std::vector<Array> in;
  int64_t kept = 0, other = 0;  // elements
  for (const Array& x : xs) {
    if (const Array* r = rows_of(x)) {
      const Layout l = global::layout_of(*r);
      if (x.shape() != out || (rows && l != *rows)) return std::nullopt;
      rows = l;
      kept += x.size();
      in.push_back(*r);
    } else if (!x.pending_sum_axes().empty()) {
      return std::nullopt;
    } else {
      if (x.size() * m.mesh.size() > shape_size(out)) other += x.size();  // small ones: free
      in.push_back(x);
    }
  }
  if (!rows || other > kept) return std::nullopt;
  Plan q = global::elementwise_rule(m.mesh, operands(in), out, detail::op_def(id).linear);
  if (q.out.front() != *rows) return std::nullopt;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (rows_of(xs[i]) != nullptr && q.need[i] != *rows) return std::nullopt;
  }
  const Array r = apply(op, in, q, q.out, {out}, fn).front();
  return keep_as_rows(m.mesh, r, jax.out.front(), op);
}

// `op` names the call in errors and the log; `id` is the op reported (its linearity decides
// whether pending sums are kept).
Array elementwise(std::string_view op, OpId id, const std::vector<Array>& xs, Fn f) {
  MESHRT_DCHECK(detail::op_def(id).placement == detail::Placement::elementwise);
  const Shape out = broadcast_shape(op, ptrs(xs));
  const OpMesh m = global::op_mesh(op, ptrs(xs));
  Plan p = global::elementwise_rule(m.mesh, operands(xs), out, detail::op_def(id).linear);
  const global::LocalFn fn = [f](const std::vector<Tensor>& b) {
    return std::vector<Tensor>{f(b)};
  };
  if (std::optional<Array> r = elementwise_in_rows(op, id, xs, out, m, p, fn)) return *r;
  return apply(op, xs, p, p.out, {out}, fn).front();
}

Array unary(OpId id, const Array& x, Tensor (*f)(const Tensor&)) {
  detail::Traced<Array> tr(id, {&x});
  return tr(elementwise(detail::op_name(id), id, {x},
                        [f](const std::vector<Tensor>& b) { return f(b[0]); }));
}

// A scalar as a 0-d tensor of the dtype JAX gives it next to `t` (weak typing).
Tensor scalar_like(const Tensor& t, Scalar s) {
  DType dt = t.dtype();
  if (!s.integral && (dt == DType::i32 || dt == DType::i64 || dt == DType::bool_)) dt = DType::f64;
  if (dt == DType::bool_) dt = DType::i32;
  return full({}, s.value, dt, t.device());
}

// Reported as <op>_scalar with its value (a bool result: no derivative rule needed).
Array compare_scalar(std::string_view op, OpId traced_as, const Array& a, Scalar s,
                     Tensor (*f)(const Tensor&, const Tensor&)) {
  detail::Traced<Array> tr(traced_as, {&a});
  if (tr) tr.set_attrs(detail::ScalarAttrs{s.value, s.integral});
  return tr(elementwise(op, traced_as, {a}, [f, s](const std::vector<Tensor>& b) {
    return f(b[0], scalar_like(b[0], s));
  }));
}

// Ops computed on the operand with dims `whole` gathered; results re-sliced where they divide.
std::vector<Array> gathered(std::string_view op, const Array& x, const std::vector<bool>& whole,
                            const std::vector<Shape>& out_shapes, BlockFn body) {
  const OpMesh m = global::op_mesh(op, {&x});
  Plan p;
  std::vector<Layout> computed;
  for (const Shape& s : out_shapes) {
    Plan one = global::gather_dims_rule(m.mesh, {&x.shape(), global::layout_of(x)}, whole, s);
    p.need = one.need;
    p.out.push_back(one.out.front());
    computed.push_back(one.need.front());
  }
  return apply(op, {x}, p, computed, out_shapes, std::move(body));
}

Array reduce_impl(std::string_view op, const Array& x, global::Reduction kind,
                  std::optional<int> axis, bool keepdims);

Array reduce(std::string_view op, const Array& x, global::Reduction kind, std::optional<int> axis,
             bool keepdims) {
  // bf16/f16 sums and means (jnp.sum/jnp.mean): in float32 across every device, rounded once.
  if ((kind == global::Reduction::sum || kind == global::Reduction::mean) && x.valid() &&
      is_half(x.dtype())) {
    return astype(reduce(op, astype(x, DType::f32), kind, axis, keepdims), x.dtype());
  }
  const OpId id = kind == global::Reduction::sum    ? OpId::sum
                  : kind == global::Reduction::mean ? OpId::mean
                  : kind == global::Reduction::max  ? OpId::max
                  : kind == global::Reduction::min  ? OpId::min
                                                    : OpId::argmax;
  detail::Traced<Array> tr(id, {&x});
  if (tr) tr.set_attrs(detail::ReduceAttrs{axis, keepdims});
  return tr(reduce_impl(op, x, kind, axis, keepdims));
}

Array reduce_impl(std::string_view op, const Array& x, global::Reduction kind,
                  std::optional<int> axis, bool keepdims) {
  std::optional<int> ax;
  if (axis)
    ax = detail::normalize_axis(*axis, std::ssize(x.shape()), op, x.shape(), detail::Form::array);
  const OpMesh m = global::op_mesh(op, {&x});
  Plan p = global::reduce_rule(m.mesh, {&x.shape(), global::layout_of(x)}, kind, ax, keepdims);
  const Shape out = detail::reduce_shape(x.shape(), ax, keepdims);
  const int64_t count = ax ? x.shape()[static_cast<size_t>(*ax)] : x.size();
  const global::AxisList over = p.reduce_axes;
  auto local = [kind, ax, keepdims, count](const Tensor& t) {
    switch (kind) {
      case global::Reduction::sum:
        return sum(t, ax, keepdims);
      case global::Reduction::mean:
        return divide(sum(astype(t, float_dtype_for(t.dtype())), ax, keepdims),
                      Scalar(static_cast<double>(count)));
      case global::Reduction::max:
        return max(t, ax, keepdims);
      case global::Reduction::min:
        return min(t, ax, keepdims);
      case global::Reduction::argmax:
        break;
    }
    return argmax(t, ax, keepdims);
  };
  // A sum over a value kept as rows, computed there and summed into jax.jit's layout: the
  // tensor-parallel MLP's bias gradients (a small psum_scatter instead of moving the rows).
  const bool linear = kind == global::Reduction::sum || kind == global::Reduction::mean;
  if (const Array* rows = rows_of(x); rows != nullptr && linear && x.pending_sum_axes().empty() &&
                                      p.out.front().partial.empty() && keeps_rows(m) &&
                                      shape_size(out) * m.mesh.size() <= x.size()) {
    Plan q =
        global::reduce_rule(m.mesh, {&x.shape(), global::layout_of(*rows)}, kind, ax, keepdims);
    const Array r = apply(op, {*rows}, q, q.out, {out}, [local](const std::vector<Tensor>& b) {
                      return std::vector<Tensor>{local(b[0])};
                    }).front();
    return global::reshard(r, m.mesh, p.out.front(), op, /*implicit=*/false,
                           "reduced where its operand is kept as rows");
  }
  if (over.empty()) {
    return apply(op, {x}, p, p.out, {out},
                 [local](const std::vector<Tensor>& b) { return std::vector<Tensor>{local(b[0])}; })
        .front();
  }
  // max/min over sharded dims: the local reduction, then pmax/pmin across the devices.
  return apply(op, {x}, p, p.out, {out},
               [kind, local, over](Context& ctx, const std::vector<Tensor>& b) {
                 Tensor r = local(b[0]);
                 r = kind == global::Reduction::max ? ctx.pmax(r, AxisNames(over))
                                                    : ctx.pmin(r, AxisNames(over));
                 return std::vector<Tensor>{r};
               })
      .front();
}

Layout layout_for(std::string_view op, const Sharding& s, const Mesh& mesh, const Shape& shape,
                  std::string* note) {
  const std::optional<NamedSharding> named = s.as_named();
  if (!named || !(named->mesh() == mesh)) {
    throw Error(cat("[", op, "] the sharding ", s.str(), " is not on the operand's mesh ",
                    mesh.str(), "; use device_put to move an Array to another mesh or platform"));
  }
  Layout l = global::replicated(shape.size());
  const PartitionSpec& spec = named->spec();
  if (spec.size() > shape.size()) {
    throw Error(cat("[", op, "] ", spec.str(), " has ", spec.size(),
                    " entries but the array has rank ", shape.size(),
                    "; give at most one entry per dimension"));
  }
  for (size_t d = 0; d < shape.size(); ++d) l.dims[d] = spec[d];
  if (global::trim_to_divisible(l, shape, mesh) && note != nullptr) {
    *note = cat(spec.str(), " does not divide ", shape_tuple(shape), "; kept ",
                global::spec_of(l).str(), " as jax.jit does");
  }
  return l;
}

Array constrain(std::string_view op, const Array& x, const Sharding& s) {
  if (!s.same_mesh(x.sharding())) {
    Array y = device_put(x, s);
    if (global::LaunchObserver* o = global::launch_observer()) o->resharded(x, s, y);
    return y;
  }
  const Mesh& xm = x.sharding().as_named()->mesh();  // same_mesh: both are NamedShardings
  std::string note;
  Layout l = layout_for(op, s, xm, x.shape(), &note);
  return global::reshard(x, xm, l, op, /*implicit=*/false, note);
}

// Swaps the last two entries (of a shape or a layout's dims): an operand read transposed.
template <class V>
V swap_last_two(V v) {
  if (v.size() >= 2) std::swap(v[v.size() - 2], v[v.size() - 1]);
  return v;
}

// A matmul's product computed as rows (`rows`, laid out as `computed`: the rows split over one
// more axis than `pending`'s dims) as the pending sum over that axis jax.jit's placement gives
// (`pending`): taking the sum moves the rows; the addends (each device's rows in place, zeros
// elsewhere) are made only if something reads them.
Array deferred_rows(const Mesh& mesh, const Array& rows, const Layout& pending,
                    const Layout& computed, std::string_view op) {
  const std::string axis = pending.partial.front();
  const int64_t n = mesh.axis_size(axis);
  auto make_addends = [mesh, rows, pending, computed, axis, n]() {
    const global::Body pad_rows = [axis, n](Context& ctx, const std::vector<Tensor>& b) {
      const int64_t i = ctx.axis_index(AxisNames(axis));
      const int64_t r = b[0].shape()[0];
      return std::vector<Tensor>{pad(b[0], {{i * r, (n - 1 - i) * r}, {0, 0}})};
    };
    return detail::ArrayAccess::blocks(
        global::run_blocks(mesh, {rows}, {computed}, {pending}, {rows.shape()}, pad_rows).front());
  };
  Array r = meshrt::detail::make_deferred_pending_sum(rows.shape(), rows.dtype(),
                                                      NamedSharding(mesh, global::spec_of(pending)),
                                                      pending.partial, rows, make_addends);
  meshrt::detail::set_pending_sum_origin(r, std::string(op));
  return r;
}

// matmul, dot and matmul_transposed: `ta`/`tb` read an operand with its last two dims swapped
// (the placement rule sees the swapped operand; its blocks are placed as stored, and the kernel
// reads them transposed).
// Whether a matmul on `mesh` may take a placement that moves fewer bytes than jax.jit's
// (MESHRT_MATMUL_PLACEMENT). auto: on host memory (cpu) yes; on a device platform no: on an H200
// the tensor-parallel step took 10.3 ms placed by bytes against 8.8 ms as jax.jit places it
// (bench/results/gpu-h200-run6.md), the other strategies within noise.
bool placed_by_bytes(const Mesh& mesh) {
  switch (config::matmul_placement()) {
    case config::MatmulPlacement::cheapest:
      return true;
    case config::MatmulPlacement::jax:
      return false;
    case config::MatmulPlacement::automatic:
      break;
  }
  return detail::backend_of(mesh.devices().front().kind()).host_addressable();
}

// ---- one expression relu(x @ W + b): a layer's product waits for its epilogue

// Plain eager code: nothing traces this task (autodiff's tape, jit's trace) and no jit recorder
// observes this thread's launches.
bool plain_eager() {
  const meshrt::detail::TraceState* s = meshrt::detail::trace_state();
  return (s == nullptr || (s->tracers.empty() && !s->jit)) && global::launch_observer() == nullptr;
}

// Uninstalls this thread's launch observer while it lives.
class NoObserver {
 public:
  NoObserver() : previous_(global::set_launch_observer(nullptr)) {}
  NoObserver(const NoObserver&) = delete;
  NoObserver& operator=(const NoObserver&) = delete;
  ~NoObserver() { global::set_launch_observer(previous_); }

 private:
  global::LaunchObserver* previous_;
};

// One device's layer: a @ b (stored transposed where ta / tb), plus the row `bias`, then relu
// when `relu`, as one Backend::matmul_bias call (the unfused ops' bits).
Tensor layer_block(const Tensor& a, const Tensor& b, const Tensor& bias, bool ta, bool tb,
                   Precision precision, bool relu) {
  const int64_t m = a.shape()[ta ? 1 : 0], k = a.shape()[ta ? 0 : 1], n = b.shape()[tb ? 0 : 1];
  if (bias.size() != n || bias.dtype() != DType::f32) {
    throw Error(cat("[global] internal: a layer's bias block of ", bias.size(),
                    " elements for a product of ", n, " columns"));
  }
  Tensor y = empty({m, n}, DType::f32, a.device());
  detail::backend_of(a.device())
      .matmul_bias(a.device().local_index(), DType::f32, m, n, k, a.data(), ta, b.data(), tb,
                   precision, bias.data(), relu, y.data());
  return y;
}

// A layer's product not launched yet. On a platform that fuses a product's epilogue
// (Backend::fuses_matmul_bias: cuda with MESHRT_CUDA_MATMUL=lt), in plain eager code, a float32
// product of two matrices placed where jax.jit places it (no pending sum, every device in this
// process) waits for the ops of its expression: add(Array&&, ...) and relu(Array&&) take it as a
// temporary, `+ b` of a row bias and then relu join it, and the first read of the blocks runs
// the whole layer as one matmul_bias call per device. Anything else reads it and runs what it
// holds. The operands are placed when the layer is planned (every reshard logged at the op that
// needs it, as eager) and made then (an operand that is itself a pending layer runs: its
// expression has ended), so a layer never waits on another and a chain of them neither
// recurses when read nor when freed; they are released once the layer has run.
struct PendingLayer final : meshrt::detail::DeferredLaunch {
  PendingLayer(Mesh m, Layout o) : mesh(std::move(m)), out(std::move(o)) {}
  Mesh mesh;
  Layout out;                 // the product's layout, and the layer's
  Shape shape;                // the product's global shape
  std::vector<Array> placed;  // a and b placed as `need` says, then the bias if any
  std::vector<Layout> need;
  bool ta = false, tb = false, relu = false;
  Precision precision = Precision::highest;
  global::LocalFn product;  // the product alone, as matmul runs it

  bool has_bias() const { return placed.size() == 3; }

  std::vector<Tensor> run() const override {
    // The global view's own launch, from whichever op or thread reads the blocks first: planned
    // in plain eager code, so a value from outside any trace that reads it (an input or a
    // constant of a jitted function): no tape and no jit recorder sees it.
    const meshrt::detail::TraceScope off(meshrt::detail::TraceScope::none);
    const NoObserver quiet;
    global::LocalFn fn = product;
    if (has_bias()) {
      fn = [ta = ta, tb = tb, p = precision, r = relu](const std::vector<Tensor>& t) {
        return std::vector<Tensor>{layer_block(t[0], t[1], t[2], ta, tb, p, r)};
      };
    }
    // From the reading thread, device after device (queued work on a device platform, the only
    // kind that defers): never as a shard_map, which a read inside a shard_map body would nest.
    return detail::ArrayAccess::blocks(global::run_local(mesh, placed, {out}, {shape}, fn).front());
  }
};

// `x` placed by `op` as operand `index` needs it, its blocks made (see PendingLayer).
Array placed_now(const Array& x, const OpMesh& m, const Layout& need, std::string_view op,
                 size_t index) {
  Array p = global::place(global::on_mesh(x, m), m.mesh, need, op, index);
  (void)detail::ArrayAccess::blocks(p);
  return p;
}

// The product a @ b as a PendingLayer, where one may wait (see there).
std::optional<Array> defer_layer(std::string_view op, const OpMesh& m, const Array& a,
                                 const Array& b, bool ta, bool tb, const Plan& p, const Shape& out,
                                 const OpOptions& options, const BlockFn& fn) {
  if (!plain_eager() || options.out_sharding || !fn.local) return std::nullopt;
  if (a.dtype() != DType::f32 || b.dtype() != DType::f32 || a.shape().size() != 2 ||
      b.shape().size() != 2 || out.size() != 2 || shape_size(out) == 0 ||
      a.shape()[ta ? 0 : 1] == 0 || !p.out.front().partial.empty()) {
    return std::nullopt;
  }
  const std::vector<Device>& devs = m.mesh.devices();
  if (!detail::backend_of(devs.front().kind()).fuses_matmul_bias() ||
      !std::all_of(devs.begin(), devs.end(),
                   [](const Device& d) { return d.process_index() == process_index(); })) {
    return std::nullopt;
  }
  auto layer = std::make_shared<PendingLayer>(m.mesh, p.out.front());
  layer->shape = out;
  layer->need = {p.need[0], p.need[1]};
  layer->placed = {placed_now(a, m, p.need[0], op, 0), placed_now(b, m, p.need[1], op, 1)};
  layer->ta = ta;
  layer->tb = tb;
  layer->precision = *options.precision;
  layer->product = fn.local;
  const Sharding sharding = m.single ? Sharding(SingleDeviceSharding(devs.front()))
                                     : Sharding(NamedSharding(m.mesh, global::spec_of(layer->out)));
  return meshrt::detail::make_deferred_launch(out, DType::f32, sharding, std::move(layer));
}

// The layer `y` waits on, when it is a PendingLayer that `next` may still join in plain eager
// code; else null.
std::shared_ptr<const PendingLayer> joinable_layer(const Array& y) {
  if (!plain_eager()) return nullptr;
  return std::dynamic_pointer_cast<const PendingLayer>(meshrt::detail::pending_launch(y));
}

// `y + bias` (`bias + y` when bias_first) as the pending layer `y` with its bias, where `y` is a
// pending product without one and `bias` a float32 row of its columns ((n,) or (1, n)) that the
// add, with its operands in that order, places without moving `y`.
std::optional<Array> join_bias(const Array& y, const Array& bias, bool bias_first) {
  const std::shared_ptr<const PendingLayer> layer = joinable_layer(y);
  if (layer == nullptr || layer->has_bias() || layer->relu || !bias.valid() ||
      bias.dtype() != DType::f32 || rows_of(bias) != nullptr) {
    return std::nullopt;
  }
  const int64_t n = y.shape()[1];
  if (bias.shape() != Shape{n} && bias.shape() != Shape{1, n}) return std::nullopt;
  // Placed as add places it (the same rule, operands in the same order, the same reshard, logged
  // at this add).
  const size_t yi = bias_first ? 1 : 0, bi = 1 - yi;
  const std::vector<Array> xs =
      bias_first ? std::vector<Array>{bias, y} : std::vector<Array>{y, bias};
  const OpMesh m = global::op_mesh("add", ptrs(xs));
  const Plan p =
      global::elementwise_rule(m.mesh, operands(xs), y.shape(), detail::op_def(OpId::add).linear);
  if (p.out.front() != layer->out || p.need[yi] != layer->out || !(m.mesh == layer->mesh)) {
    return std::nullopt;
  }
  auto next = std::make_shared<PendingLayer>(*layer);
  next->placed.push_back(placed_now(bias, m, p.need[bi], "add", bi));
  next->need.push_back(p.need[bi]);
  return meshrt::detail::make_deferred_launch(y.shape(), y.dtype(), y.sharding(), std::move(next));
}

Array matmul_like(std::string_view op, const Array& a, const Array& b, const OpOptions& options,
                  bool ta, bool tb, std::function<Tensor(const Tensor&, const Tensor&)> f) {
  detail::Traced<Array> tr(ta || tb ? OpId::matmul_transposed : OpId::matmul, {&a, &b});
  if (tr) tr.set_attrs(detail::MatmulAttrs{ta, tb, *options.precision});
  const Shape out = detail::matmul_shape(a.shape(), b.shape(), ta, tb, op, cat("[", op, "] ")).out;
  const Shape sa = ta ? swap_last_two(a.shape()) : a.shape();
  const Shape sb = tb ? swap_last_two(b.shape()) : b.shape();
  const OpMesh m = global::op_mesh(op, {&a, &b});
  Layout la = global::layout_of(a), lb = global::layout_of(b);
  if (ta) la.dims = swap_last_two(la.dims);
  if (tb) lb.dims = swap_last_two(lb.dims);
  Plan p = global::matmul_rule(m.mesh, {&sa, la}, {&sb, lb});
  // Where the operands are: an operand kept as rows is priced, and read, there.
  const bool rows_kept = keeps_rows(m);
  Layout la_at = la, lb_at = lb;
  if (const Array* r = rows_of(a); r != nullptr && rows_kept) {
    la_at = global::layout_of(*r);
    if (ta) la_at.dims = swap_last_two(la_at.dims);
  }
  if (const Array* r = rows_of(b); r != nullptr && rows_kept) {
    lb_at = global::layout_of(*r);
    if (tb) lb_at.dims = swap_last_two(lb_at.dims);
  }
  // A placement that moves fewer bytes, then the reshard to the rule's layout (auto mode only:
  // in explicit mode every reshard is the user's).
  std::optional<global::MatmulChoice> alt;
  if (!m.single && sharding_mode() == ShardingMode::auto_ && placed_by_bytes(m.mesh)) {
    alt = global::cheaper_matmul(m.mesh, {&sa, la_at}, {&sb, lb_at}, p, la_at != la || lb_at != lb);
  }
  if (ta) p.need[0].dims = swap_last_two(p.need[0].dims);
  if (tb) p.need[1].dims = swap_last_two(p.need[1].dims);
  const BlockFn fn = [f](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{f(t[0], t[1])};
  };
  Array r;
  if (alt) {
    Plan q = alt->plan;
    if (ta) q.need[0].dims = swap_last_two(q.need[0].dims);
    if (tb) q.need[1].dims = swap_last_two(q.need[1].dims);
    const std::string note =
        cat("computed as ", alt->form, " (", layout_str(alt->plan.out.front()), "): about ",
            alt->cost, " elements written per device against ", alt->jax_cost,
            " for jax.jit's placement; MESHRT_MATMUL_PLACEMENT=jax computes it as jax.jit does");
    const Array pa = global::reshard(a, m.mesh, q.need[0], op, /*implicit=*/true, note, "args[0]");
    const Array pb = global::reshard(b, m.mesh, q.need[1], op, /*implicit=*/true, note, "args[1]");
    r = apply(op, {pa, pb}, q, q.out, {out}, fn).front();
    if (alt->deferred) {
      r = deferred_rows(m.mesh, r, p.out.front(), q.out.front(), op);
    } else if (rows_kept && q.out.front().partial.empty() && p.out.front().partial.empty()) {
      r = keep_as_rows(m.mesh, r, p.out.front(), op);
    } else {
      r = global::reshard(r, m.mesh, p.out.front(), op, /*implicit=*/false,
                          cat("to the sharding jax.jit gives a ", op, " of these operands"));
    }
  } else if (std::optional<Array> layer = defer_layer(op, m, a, b, ta, tb, p, out, options, fn)) {
    r = *std::move(layer);
  } else {
    r = apply(op, {a, b}, p, p.out, {out}, fn).front();
  }
  if (options.out_sharding) {
    // Unlike with_sharding_constraint, out_sharding= must divide the result (as device_put).
    (void)meshrt::detail::checked_shard_shape(*options.out_sharding, r.shape(), op);
    r = constrain(op, r, *options.out_sharding);
  }
  return tr(r);
}

Shape local_shape(const Mesh& mesh, const Layout& l, const Shape& global_shape) {
  Shape s = global_shape;
  for (size_t d = 0; d < s.size(); ++d) s[d] /= global::axes_size(mesh, l.dims[d]);
  return s;
}

// `shape` may hold one -1 (reshape's), inferred here.
Array reshaped(std::string_view op, const Array& x, const Shape& shape) {
  detail::Traced<Array> tr(OpId::reshape, {&x});
  const Shape out = detail::reshape_shape(x.shape(), shape, op, detail::Form::array);
  const OpMesh m = global::op_mesh(op, {&x});
  Plan p = global::reshape_rule(m.mesh, {&x.shape(), global::layout_of(x)}, out);
  const Shape local = local_shape(m.mesh, p.out.front(), out);
  return tr(apply(op, {x}, p, p.out, {out}, [local](const std::vector<Tensor>& b) {
              return std::vector<Tensor>{reshape(b[0], local)};
            }).front());
}

Array join(std::string_view op, const std::vector<Array>& xs, int axis, bool stack_) {
  detail::Traced<Array> tr(stack_ ? OpId::stack : OpId::concatenate, xs);
  if (xs.empty()) throw Error(cat("[", op, "] needs at least one array"));
  const int ax = detail::normalize_axis(axis, std::ssize(xs.front().shape()) + (stack_ ? 1 : 0), op,
                                        xs.front().shape(), detail::Form::array);
  if (tr) tr.set_attrs(detail::AxisAttrs{ax});
  std::vector<Shape> shapes;
  for (const Array& x : xs) shapes.push_back(x.shape());
  const Shape out = detail::join_shape(shapes, ax, stack_, detail::Form::array);
  const OpMesh m = global::op_mesh(op, ptrs(xs));
  Plan p = global::join_rule(m.mesh, operands(xs), ax, stack_, out);
  Layout computed{p.need.front().dims, {}};
  if (stack_) computed.dims.insert(computed.dims.begin() + ax, global::AxisList{});
  // Dims other than the joined one take the plan's choice; the joined one is computed whole.
  for (size_t d = 0; d < computed.dims.size(); ++d) {
    if (static_cast<int>(d) != ax) computed.dims[d] = p.out.front().dims[d];
  }
  return tr(apply(op, xs, p, {computed}, {out}, [ax, stack_](const std::vector<Tensor>& b) {
              return std::vector<Tensor>{stack_ ? stack(b, ax) : concatenate(b, ax)};
            }).front());
}

Array creation(const Shape& shape, const Sharding& s,
               const std::function<Tensor(Device, const Shape&, const Index&)>& make) {
  const Shape block = s.shard_shape(shape);
  std::vector<Tensor> blocks;
  std::optional<DType> dt;
  for (auto& [dev, idx] : s.devices_indices_map(shape)) {
    if (!detail::is_local(dev)) {  // another process's device makes its own block
      blocks.emplace_back();
      continue;
    }
    blocks.push_back(make(dev, block, idx));
    dt = blocks.back().dtype();
  }
  if (!dt) {
    throw Error(cat("[array] ", s.str(),
                    " has no device in this process: every process must hold a device of each "
                    "mesh it computes on"));
  }
  return detail::ArrayAccess::make(shape, *dt, s, std::move(blocks));
}

// Reading an Array with pending sums sums them (psum), logged under the op that made the sum,
// noted as summed at a read.
Array resolve_for_read(const Array& x) {
  const Mesh& m = x.sharding().as_named()->mesh();  // pending sums are over a mesh's axes
  Layout l = global::layout_of(x);
  l.partial.clear();
  return global::reshard(x, m, l, "read", /*implicit=*/false);
}
const bool kResolverInstalled = [] {
  detail::set_pending_sum_resolver(&resolve_for_read);
  return true;
}();

}  // namespace

// The one member of runtime/'s Array defined above runtime/ (see runtime/array.h): x[i] is row.
Array Array::operator[](int64_t i) const { return row(*this, i); }

// ---- creation
Array zeros(Shape shape, DType dtype, const Sharding& s) {
  return full(std::move(shape), 0.0, dtype, s);
}
Array ones(Shape shape, DType dtype, const Sharding& s) {
  return full(std::move(shape), 1.0, dtype, s);
}
Array full(Shape shape, double value, DType dtype, const Sharding& s) {
  return creation(shape, s, [&](Device d, const Shape& block, const Index&) {
    return full(block, value, dtype, d);
  });
}
Array arange(int64_t n, DType dtype, const Sharding& s) {
  return creation({n}, s, [&](Device d, const Shape& block, const Index& idx) {
    Tensor t = arange(block[0], dtype, d);
    if (idx[0].first == 0) return t;
    const Scalar off = (dtype == DType::f32 || dtype == DType::f64)
                           ? Scalar(static_cast<double>(idx[0].first))
                           : Scalar(idx[0].first);
    return add(t, off);
  });
}
Array astype(const Array& x, DType dtype) {
  detail::Traced<Array> tr(OpId::astype, {&x});
  return tr(elementwise("astype", OpId::astype, {x},
                        [dtype](const std::vector<Tensor>& b) { return astype(b[0], dtype); }));
}

Array with_sharding_constraint(const Array& x, const Sharding& s) {
  if (!x.valid()) {  // not blocks(): a value kept as rows is moved from its rows, once
    throw Error("[with_sharding_constraint] an empty (default-constructed or moved-from) Array");
  }
  detail::Traced<Array> tr(OpId::with_sharding_constraint, {&x});
  return tr(constrain("with_sharding_constraint", x, s));
}

// ---- elementwise
#define MESHRT_BINARY(name)                                                                \
  Array name(const Array& a, const Array& b) {                                             \
    detail::Traced<Array> tr(OpId::name, {&a, &b});                                        \
    return tr(elementwise(#name, OpId::name, {a, b},                                       \
                          [](const std::vector<Tensor>& t) { return name(t[0], t[1]); })); \
  }
MESHRT_BINARY(add)
MESHRT_BINARY(subtract)
MESHRT_BINARY(multiply)
MESHRT_BINARY(divide)
MESHRT_BINARY(maximum)
MESHRT_BINARY(minimum)
MESHRT_BINARY(equal)
MESHRT_BINARY(not_equal)
MESHRT_BINARY(less)
MESHRT_BINARY(less_equal)
MESHRT_BINARY(greater)
MESHRT_BINARY(greater_equal)
#undef MESHRT_BINARY

Array where(const Array& c, const Array& a, const Array& b) {
  detail::Traced<Array> tr(OpId::where, {&c, &a, &b});
  return tr(elementwise("where", OpId::where, {c, a, b},
                        [](const std::vector<Tensor>& t) { return where(t[0], t[1], t[2]); }));
}

Array neg(const Array& x) {
  detail::Traced<Array> tr(OpId::neg, {&x});
  return tr(
      elementwise("neg", OpId::neg, {x}, [](const std::vector<Tensor>& t) { return neg(t[0]); }));
}
Array exp(const Array& x) { return unary(OpId::exp, x, &exp); }
Array log(const Array& x) { return unary(OpId::log, x, &log); }
Array sin(const Array& x) { return unary(OpId::sin, x, &sin); }
Array cos(const Array& x) { return unary(OpId::cos, x, &cos); }
Array tanh(const Array& x) { return unary(OpId::tanh, x, &tanh); }
Array sqrt(const Array& x) { return unary(OpId::sqrt, x, &sqrt); }
Array relu(const Array& x) { return unary(OpId::relu, x, &relu); }

// The temporaries of one expression: a pending layer (see PendingLayer) takes its bias and relu.
Array add(Array&& a, const Array& b) {
  if (std::optional<Array> layer = join_bias(a, b, false)) return *std::move(layer);
  return add(std::as_const(a), b);
}
Array add(const Array& a, Array&& b) {
  if (std::optional<Array> layer = join_bias(b, a, true)) return *std::move(layer);
  return add(a, std::as_const(b));
}
Array add(Array&& a, Array&& b) {
  if (std::optional<Array> layer = join_bias(a, b, false)) return *std::move(layer);
  if (std::optional<Array> layer = join_bias(b, a, true)) return *std::move(layer);
  return add(std::as_const(a), std::as_const(b));
}
Array relu(Array&& x) {
  if (const std::shared_ptr<const PendingLayer> layer = joinable_layer(x);
      layer != nullptr && layer->has_bias() && !layer->relu) {
    auto next = std::make_shared<PendingLayer>(*layer);
    next->relu = true;
    return meshrt::detail::make_deferred_launch(x.shape(), x.dtype(), x.sharding(),
                                                std::move(next));
  }
  return relu(std::as_const(x));
}

// Recorded for autodiff as <op>_scalar (rsub_/rdiv_ with the scalar first), with its value.
Array scalar_elementwise(std::string_view op, OpId traced_as, const Array& a, Scalar s, Fn f) {
  detail::Traced<Array> tr(traced_as, {&a});
  if (tr) tr.set_attrs(detail::ScalarAttrs{s.value, s.integral});
  return tr(elementwise(op, traced_as, {a}, std::move(f)));
}

#define MESHRT_SCALAR(name, traced_as, expr)                                       \
  Array name(const Array& a, Scalar s) {                                           \
    return scalar_elementwise(#name, OpId::traced_as, a, s,                        \
                              [s](const std::vector<Tensor>& t) { return expr; }); \
  }
MESHRT_SCALAR(add, add_scalar, add(t[0], s))
MESHRT_SCALAR(subtract, sub_scalar, subtract(t[0], s))
MESHRT_SCALAR(multiply, mul_scalar, multiply(t[0], s))
MESHRT_SCALAR(divide, div_scalar, divide(t[0], s))
MESHRT_SCALAR(maximum, max_scalar, maximum(t[0], s))
MESHRT_SCALAR(minimum, min_scalar, minimum(t[0], s))
#undef MESHRT_SCALAR
Array subtract(Scalar s, const Array& b) {
  return scalar_elementwise("subtract", OpId::rsub_scalar, b, s,
                            [s](const std::vector<Tensor>& t) { return subtract(s, t[0]); });
}
Array divide(Scalar s, const Array& b) {
  return scalar_elementwise("divide", OpId::rdiv_scalar, b, s,
                            [s](const std::vector<Tensor>& t) { return divide(s, t[0]); });
}
Array equal(const Array& a, Scalar s) {
  return compare_scalar("equal", OpId::equal_scalar, a, s, &equal);
}
Array not_equal(const Array& a, Scalar s) {
  return compare_scalar("not_equal", OpId::not_equal_scalar, a, s, &not_equal);
}
Array less(const Array& a, Scalar s) {
  return compare_scalar("less", OpId::less_scalar, a, s, &less);
}
Array less_equal(const Array& a, Scalar s) {
  return compare_scalar("less_equal", OpId::less_equal_scalar, a, s, &less_equal);
}
Array greater(const Array& a, Scalar s) {
  return compare_scalar("greater", OpId::greater_scalar, a, s, &greater);
}
Array greater_equal(const Array& a, Scalar s) {
  return compare_scalar("greater_equal", OpId::greater_equal_scalar, a, s, &greater_equal);
}

// ---- reductions
Array sum(const Array& x, std::optional<int> axis, bool keepdims) {
  return reduce("sum", x, global::Reduction::sum, axis, keepdims);
}
Array mean(const Array& x, std::optional<int> axis, bool keepdims) {
  return reduce("mean", x, global::Reduction::mean, axis, keepdims);
}
Array max(const Array& x, std::optional<int> axis, bool keepdims) {
  return reduce("max", x, global::Reduction::max, axis, keepdims);
}
Array min(const Array& x, std::optional<int> axis, bool keepdims) {
  return reduce("min", x, global::Reduction::min, axis, keepdims);
}
Array argmax(const Array& x, std::optional<int> axis, bool keepdims) {
  return reduce("argmax", x, global::Reduction::argmax, axis, keepdims);
}

Array softmax(const Array& x, int axis) {
  detail::Traced<Array> tr(OpId::softmax, {&x});
  if (tr) tr.set_attrs(detail::AxisAttrs{axis});
  const int ax = detail::normalize_axis(axis, std::ssize(x.shape()), "softmax", x.shape(),
                                        detail::Form::array);
  std::vector<bool> whole(x.shape().size(), false);
  whole[static_cast<size_t>(ax)] = true;
  return tr(gathered("softmax", x, whole, {x.shape()}, [ax](const std::vector<Tensor>& b) {
              return std::vector<Tensor>{softmax(b[0], ax)};
            }).front());
}
Array log_softmax(const Array& x, int axis) {
  detail::Traced<Array> tr(OpId::log_softmax, {&x});
  if (tr) tr.set_attrs(detail::AxisAttrs{axis});
  const int ax = detail::normalize_axis(axis, std::ssize(x.shape()), "log_softmax", x.shape(),
                                        detail::Form::array);
  std::vector<bool> whole(x.shape().size(), false);
  whole[static_cast<size_t>(ax)] = true;
  return tr(gathered("log_softmax", x, whole, {x.shape()}, [ax](const std::vector<Tensor>& b) {
              return std::vector<Tensor>{log_softmax(b[0], ax)};
            }).front());
}

// ---- linear algebra
namespace {
// The options with the precision resolved once, at the call (the per-device products and the
// trace see the same value even if the default changes meanwhile).
OpOptions with_precision(const OpOptions& o) {
  OpOptions r = o;
  if (!r.precision) r.precision = default_matmul_precision();
  return r;
}
}  // namespace

Array matmul(const Array& a, const Array& b, const OpOptions& o0) {
  const OpOptions o = with_precision(o0);
  const MatmulOptions mo{o.precision};
  return matmul_like("matmul", a, b, o, false, false,
                     [mo](const Tensor& x, const Tensor& y) { return matmul(x, y, mo); });
}
Array matmul_transposed(const Array& a, const Array& b, bool transpose_a, bool transpose_b,
                        const OpOptions& o0) {
  const OpOptions o = with_precision(o0);
  const MatmulOptions mo{o.precision};
  return matmul_like("matmul_transposed", a, b, o, transpose_a, transpose_b,
                     [transpose_a, transpose_b, mo](const Tensor& x, const Tensor& y) {
                       return matmul_transposed(x, y, transpose_a, transpose_b, mo);
                     });
}
Array dot(const Array& a, const Array& b, const OpOptions& o0) {
  const OpOptions o = with_precision(o0);
  const MatmulOptions mo{o.precision};
  return matmul_like("dot", a, b, o, false, false,
                     [mo](const Tensor& x, const Tensor& y) { return dot(x, y, mo); });
}

Array transpose(const Array& x, std::vector<int> perm) {
  const Shape out = detail::permute_shape(x.shape(), perm, detail::Form::array);
  detail::Traced<Array> tr(OpId::transpose, {&x});
  if (tr) tr.set_attrs(detail::PermAttrs{{perm.begin(), perm.end()}});
  Plan p = global::transpose_rule({&x.shape(), global::layout_of(x)}, perm);
  return tr(apply("transpose", {x}, p, p.out, {out}, [perm](const std::vector<Tensor>& b) {
              return std::vector<Tensor>{transpose(b[0], perm)};
            }).front());
}

// ---- shape
Array reshape(const Array& x, Shape shape) { return reshaped("reshape", x, shape); }

Array squeeze(const Array& x, std::vector<int> axes) {
  const Shape& s = x.shape();
  std::vector<bool> drop(s.size(), false);
  if (axes.empty()) {
    for (size_t d = 0; d < s.size(); ++d) drop[d] = s[d] == 1;
  }
  for (int a : axes) {
    const int d = detail::normalize_axis(a, std::ssize(s), "squeeze", s, detail::Form::array);
    if (s[static_cast<size_t>(d)] != 1) {
      throw Error(
          cat("[squeeze] cannot select an axis to squeeze out which has size not equal to one, got "
              "shape=",
              shape_tuple(s), " and dimensions=(", a, ",)"));
    }
    drop[static_cast<size_t>(d)] = true;
  }
  Shape out;
  for (size_t d = 0; d < s.size(); ++d) {
    if (!drop[d]) out.push_back(s[d]);
  }
  return reshaped("squeeze", x, out);
}

Array expand_dims(const Array& x, int axis) {
  const int ax = detail::normalize_axis(axis, std::ssize(x.shape()) + 1, "expand_dims", x.shape(),
                                        detail::Form::array);
  Shape out = x.shape();
  out.insert(out.begin() + ax, 1);
  return reshaped("expand_dims", x, out);
}

Array slice(const Array& x, const Shape& start, const Shape& limit, const Shape& strides) {
  const Shape& s = x.shape();
  const Shape out = detail::slice_shape(s, start, limit, strides, detail::Form::array);
  std::vector<bool> whole(s.size());
  for (size_t d = 0; d < s.size(); ++d) {
    whole[d] = start[d] != 0 || limit[d] != s[d] || (!strides.empty() && strides[d] != 1);
  }
  detail::Traced<Array> tr(OpId::slice, {&x});
  if (tr) {
    tr.set_attrs(
        detail::SliceAttrs{start, limit, strides.empty() ? Shape(start.size(), 1) : strides});
  }
  return tr(gathered("slice", x, whole, {out},
                     [start, limit, strides, whole](const std::vector<Tensor>& b) {
                       // Dims the slice leaves whole may still be sharded: each device keeps all
                       // of its block there.
                       Shape st = start, li = limit;
                       Shape sd = strides.empty() ? Shape(start.size(), 1) : strides;
                       for (size_t d = 0; d < st.size(); ++d) {
                         if (!whole[d]) st[d] = 0, li[d] = b[0].shape()[d], sd[d] = 1;
                       }
                       return std::vector<Tensor>{slice(b[0], st, li, sd)};
                     })
                .front());
}

Array slice_in_dim(const Array& x, int64_t start, int64_t limit, int64_t stride, int axis) {
  const int ax = detail::normalize_axis(axis, std::ssize(x.shape()), "slice_in_dim", x.shape(),
                                        detail::Form::array);
  Shape st(x.shape().size(), 0), li = x.shape(), sd(x.shape().size(), 1);
  st[static_cast<size_t>(ax)] = start < 0 ? start + x.shape()[static_cast<size_t>(ax)] : start;
  li[static_cast<size_t>(ax)] = limit < 0 ? limit + x.shape()[static_cast<size_t>(ax)] : limit;
  sd[static_cast<size_t>(ax)] = stride;
  return slice(x, st, li, sd);
}

Array dynamic_slice_in_dim(const Array& x, int64_t start, int64_t size, int axis) {
  const int ax = detail::normalize_axis(axis, std::ssize(x.shape()), "dynamic_slice_in_dim",
                                        x.shape(), detail::Form::array);
  const int64_t n = x.shape()[static_cast<size_t>(ax)];
  if (size < 0 || size > n) {
    throw Error(cat("[dynamic_slice_in_dim] slice size ", size, " does not fit dimension ", ax,
                    " of size ", n));
  }
  std::vector<bool> whole(x.shape().size(), false);
  whole[static_cast<size_t>(ax)] = true;
  Shape out = x.shape();
  out[static_cast<size_t>(ax)] = size;
  detail::Traced<Array> tr(OpId::slice, {&x});
  if (tr) {  // recorded as the static slice it is once the start is clamped
    const int64_t at = std::clamp<int64_t>(start, 0, n - size);
    detail::SliceAttrs a{Shape(x.shape().size(), 0), x.shape(), Shape(x.shape().size(), 1)};
    a.start[static_cast<size_t>(ax)] = at;
    a.limit[static_cast<size_t>(ax)] = at + size;
    tr.set_attrs(std::move(a));
  }
  return tr(gathered("dynamic_slice_in_dim", x, whole, {out}, [=](const std::vector<Tensor>& b) {
              return std::vector<Tensor>{dynamic_slice_in_dim(b[0], start, size, ax)};
            }).front());
}

Array row(const Array& x, int64_t i) {
  if (x.shape().empty()) throw Error("[row] indexing a 0-d array");
  const int64_t n = x.shape()[0];
  if (i < -n || i >= n)
    throw Error(cat("[row] index ", i, " is out of bounds for axis 0 with size ", n));
  if (i < 0) i += n;
  Array r = slice_in_dim(x, i, i + 1, 1, 0);
  Shape out(x.shape().begin() + 1, x.shape().end());
  return reshaped("row", r, out);
}

Array pad(const Array& x, const std::vector<std::pair<int64_t, int64_t>>& widths, double value) {
  const Shape out = detail::pad_shape(x.shape(), widths, detail::Form::array);
  std::vector<bool> whole(out.size());
  for (size_t d = 0; d < out.size(); ++d) {
    whole[d] = widths[d].first != 0 || widths[d].second != 0;
  }
  detail::Traced<Array> tr(OpId::pad, {&x});
  if (tr) tr.set_attrs(detail::PadAttrs{widths, value});
  return tr(gathered("pad", x, whole, {out}, [widths, value](const std::vector<Tensor>& b) {
              return std::vector<Tensor>{pad(b[0], widths, value)};
            }).front());
}

Array concatenate(const std::vector<Array>& xs, int axis) {
  return join("concatenate", xs, axis, false);
}
Array stack(const std::vector<Array>& xs, int axis) { return join("stack", xs, axis, true); }

std::vector<Array> split(const Array& x, int64_t sections, int axis) {
  const int ax =
      detail::normalize_axis(axis, std::ssize(x.shape()), "split", x.shape(), detail::Form::array);
  const Shape piece = detail::split_shape(x.shape(), sections, ax, detail::Form::array);
  std::vector<bool> whole(x.shape().size(), false);
  whole[static_cast<size_t>(ax)] = true;
  detail::Traced<Array> tr(OpId::split, {&x});
  if (tr) tr.set_attrs(detail::AxisAttrs{ax});
  return tr.outputs(
      gathered("split", x, whole, std::vector<Shape>(static_cast<size_t>(sections), piece),
               [sections, ax](const std::vector<Tensor>& b) { return split(b[0], sections, ax); }));
}

}  // namespace meshrt
