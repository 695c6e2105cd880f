// Context: what a shard_map body calls. Checks arguments exactly as JAX does, then hands the
// call to the collectives layer.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "backends/backend.h"
#include "backends/process_comm.h"
#include "collectives/algo.h"
#include "collectives/collective.h"
#include "collectives/reduce.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/detail/launch.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/trace.h"
#include "runtime/shard_map.h"

namespace meshrt {

using detail::cat;

namespace detail {

namespace {

// Several processes: who holds each mesh position, when the mesh spans more than this process.
// Launches on such meshes are numbered (every process makes the same ones, in order), so the
// agreement check across processes tells launches apart.
std::shared_ptr<const coll::CrossProcess> cross_process(const Mesh& mesh) {
  const ProcessLayout& layout = process_layout();
  if (layout.size == 1) return nullptr;
  auto cp = std::make_shared<coll::CrossProcess>();
  bool others = false;
  for (const Device& d : mesh.devices()) {
    cp->process_of.push_back(d.process_index());
    others = others || d.process_index() != layout.rank;
  }
  if (!others) return nullptr;
  static std::atomic<int64_t> launches{0};  // run_bodies serialises launches
  cp->comm = backend::process_comm();
  cp->rank = layout.rank;
  cp->launch = cat("shard_map #", ++launches, " over mesh ", shape_str(mesh.shape()), " ",
                   names_tuple(mesh.axis_names()));
  return cp;
}

}  // namespace

Launch::Launch(Mesh m, std::chrono::milliseconds timeout, bool oversubscribed)
    : mesh(std::move(m)),
      session(
          [&] {
            std::vector<std::string> names;
            for (const Device& d : mesh.devices()) names.push_back(d.str());
            return names;
          }(),
          timeout, oversubscribed, cross_process(mesh)),
      host_addressable(backend_of(mesh.devices().front().kind()).host_addressable()) {
  // Parsed here, not per collective: config::collective_algo() accepts only valid names.
  env_algo = coll::parse_algo(config::collective_algo()).value_or(coll::Algo::automatic);
  env_deterministic = config::deterministic();
}

namespace {
// Group layouts by (mesh shape, axes positions, axes names), kept for the process's life: a
// program uses a handful, and every launch of it the same ones.
const coll::GroupLayout* shared_layout(const Shape& shape, const std::vector<std::string>& names,
                                       const std::vector<int>& axes) {
  using Key = std::tuple<Shape, std::vector<int>, std::vector<std::string>>;
  static std::mutex mu;
  static auto* layouts = new std::map<Key, std::unique_ptr<coll::GroupLayout>>;  // leaked: used
                                                                                 // until exit
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*layouts)[Key{shape, axes, names}];
  if (!slot) {
    slot = std::make_unique<coll::GroupLayout>(coll::make_group_layout(shape, axes));
    slot->axis_names = names;
  }
  return slot.get();
}
}  // namespace

const coll::GroupLayout& Launch::layout(const std::vector<std::string>& names,
                                        const std::vector<int>& axes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = layouts_[axes];
  if (slot == nullptr) slot = shared_layout(mesh.shape(), names, axes);
  return *slot;
}

// An asynchronous collective between its start and wait(): the launch keeps the rendezvous
// session alive for it.
struct PendingState {
  std::shared_ptr<Launch> launch;
  coll::Pending pending;
  Tensor out;
};

}  // namespace detail

namespace {

std::string axes_tuple(const std::vector<std::string>& names) { return detail::names_tuple(names); }

static_assert(
    static_cast<int>(coll::Algo::automatic) == static_cast<int>(CollectiveAlgo::automatic) &&
        static_cast<int>(coll::Algo::direct) == static_cast<int>(CollectiveAlgo::direct) &&
        static_cast<int>(coll::Algo::ring) == static_cast<int>(CollectiveAlgo::ring) &&
        static_cast<int>(coll::Algo::bidi_ring) == static_cast<int>(CollectiveAlgo::bidi_ring) &&
        static_cast<int>(coll::Algo::native) == static_cast<int>(CollectiveAlgo::native),
    "CollectiveAlgo and coll::Algo list the algorithms in the same order");

coll::Algo to_coll(CollectiveAlgo a) { return static_cast<coll::Algo>(a); }
CollectiveAlgo from_coll(coll::Algo a) { return static_cast<CollectiveAlgo>(a); }

}  // namespace

CollectiveAlgo parse_collective_algo(std::string_view name) {
  if (const std::optional<coll::Algo> a = coll::parse_algo(name)) return from_coll(*a);
  throw Error(cat("[collective_algo] '", name, "' is not one of ", coll::algo_names()));
}

std::string_view collective_algo_name(CollectiveAlgo algo) {
  return coll::algo_name(to_coll(algo));
}

Device Context::device() const {
  return state_->launch->mesh.devices()[static_cast<size_t>(state_->pos)];
}
const Mesh& Context::mesh() const { return state_->launch->mesh; }

namespace {

// "axis 'x'" or "axes ('x', 'y')", for messages.
std::string axes_text(const AxisNames& axes) {
  if (axes.names().size() == 1) return cat("axis ", detail::quote(axes.names().front()));
  return cat("axes ", detail::names_tuple(axes.names()));
}

// The device's group layout for the axes, with the operand checked.
struct Prepared {
  const coll::GroupLayout* layout;
  int64_t group_size;
};

Prepared prepare(detail::BodyState& state, const Tensor& x, const AxisNames& axes, const char* op) {
  const Device device = state.launch->mesh.devices()[static_cast<size_t>(state.pos)];
  if (!x.valid())
    throw Error(cat("[", op, "] the operand is an empty (default-constructed) Tensor"));
  if (x.device() != device) {
    throw Error(cat("[", op, "] the operand lives on ", x.device().str(), " but this body runs on ",
                    device.str(), "; collectives take tensors of the body's own device"));
  }
  // Layouts this device used before are found by name, without the launch's lock.
  const std::vector<std::string>& names = axes.names();
  for (const coll::GroupLayout* l : state.layouts) {
    if (l->axis_names == names) return {l, l->group_size};
  }
  const Mesh& mesh = state.launch->mesh;
  std::vector<int> positions;
  for (size_t i = 0; i < names.size(); ++i) {
    int at = mesh.axis_position(names[i]);
    if (at < 0) {
      throw Error(cat("[", op, "] Found an unbound axis name: ", names[i], ". The mesh axes are ",
                      axes_tuple(mesh.axis_names()), "; name one of them"));
    }
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) !=
        names.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw Error(cat("[", op, "] axis ", detail::quote(names[i]), " appears twice in axis_name ",
                      axes_tuple(names)));
    }
    positions.push_back(at);
  }
  const coll::GroupLayout* l = &state.launch->layout(names, positions);
  state.layouts.push_back(l);
  return {l, l->group_size};
}

}  // namespace

int64_t Context::axis_index(const AxisNames& axes) const {
  const Mesh& mesh = state_->launch->mesh;
  std::vector<int64_t> c = mesh.coords(state_->pos);
  int64_t idx = 0;
  for (const std::string& a : axes.names()) {
    int at = mesh.axis_position(a);
    if (at < 0) {
      throw Error(cat("[axis_index] Found an unbound axis name: ", a, ". The mesh axes are ",
                      axes_tuple(mesh.axis_names())));
    }
    idx = idx * mesh.shape()[static_cast<size_t>(at)] + c[static_cast<size_t>(at)];
  }
  return idx;
}

int64_t Context::axis_size(const AxisNames& axes) const {
  int64_t n = 1;
  for (const std::string& a : axes.names()) {
    if (state_->launch->mesh.axis_position(a) < 0) {
      throw Error(cat("[axis_size] Found an unbound axis name: ", a, ". The mesh axes are ",
                      axes_tuple(state_->launch->mesh.axis_names())));
    }
    n *= state_->launch->mesh.axis_size(a);
  }
  return n;
}

namespace {

// Joins the collective and returns the pending handle and the output tensor.
std::pair<coll::Pending, Tensor> begin(detail::Launch& launch, int64_t pos,
                                       const coll::GroupLayout& layout, const coll::Call& call,
                                       const Tensor& x, Shape out_shape, DType out_dtype) {
  Tensor out = empty(out_shape, out_dtype, x.device());
  coll::Slot slot;
  slot.backend = &detail::TensorAccess::buffer(out)->backend();
  slot.device = x.device().local_index();
  slot.in = x.data();
  slot.out = out.data();
  slot.keep_in = detail::TensorAccess::buffer(x);
  slot.keep_out = detail::TensorAccess::buffer(out);
  if (const int64_t wb = coll::work_bytes(call, layout.group_size); wb > 0) {
    auto buf =
        detail::backend_of(x.device()).allocate(x.device().local_index(), static_cast<size_t>(wb));
    slot.work = buf->data();
    slot.keep_work = std::move(buf);
  }
  coll::Pending p =
      coll::start(launch.session, pos, layout, call, std::move(slot), std::move(out_shape));
  return {std::move(p), std::move(out)};
}

// Why the platform's collective library cannot serve the group of device `pos` ("" if it can).
std::string why_not_native(const detail::Launch& launch, const coll::GroupLayout& layout,
                           int64_t pos) {
  const auto& members =
      layout.members[static_cast<size_t>(layout.group_of[static_cast<size_t>(pos)])];
  // Members in other processes are checked there (a group spanning processes runs on the
  // library's communicators across processes, collectives/cross.h).
  std::vector<int> group;
  for (int64_t m : members) {
    const Device& d = launch.mesh.devices()[static_cast<size_t>(m)];
    if (detail::is_local(d)) group.push_back(d.local_index());
  }
  return detail::backend_of(launch.mesh.devices().front().kind()).native_unavailable(group);
}

// The options as the op's attributes record them (jit replays the call with them).
detail::CollectiveHow how_of(const CollectiveOptions& options) {
  return {static_cast<uint8_t>(options.algo), options.deterministic};
}

// The call's fingerprint: op, operand, axes, and how its data moves.
coll::Call base_call(coll::Kind kind, const Tensor& x, const coll::GroupLayout& layout,
                     const CollectiveOptions& options, const detail::Launch& launch, int64_t pos) {
  coll::Call c;
  c.kind = kind;
  c.dtype = x.dtype();
  c.shape = x.shape();
  c.axes = &layout.axis_names;
  // MESHRT_COLLECTIVE_ALGO was validated when the launch began.
  const coll::AlgoRequest env{launch.env_algo, launch.env_deterministic};
  const auto why = [&] { return why_not_native(launch, layout, pos); };
  const coll::AlgoChoice how =
      coll::choose_algo(coll::kind_name(kind), {to_coll(options.algo), options.deterministic}, env,
                        launch.host_addressable, std::cref(why));  // a reference: no allocation
  c.algo = how.algo;
  c.deterministic = how.deterministic;
  return c;
}

}  // namespace

#define MESHRT_REDUCTION(method, kind)                                                           \
  Tensor Context::method(const Tensor& x, const AxisNames& axes,                                 \
                         const CollectiveOptions& options) {                                     \
    detail::Traced<Tensor> tr(detail::OpId::method, {&x});                                       \
    if (tr) tr.set_attrs(detail::CollectiveAttrs{axes.names(), how_of(options)});                \
    if (x.valid() && x.dtype() == DType::bool_) {                                                \
      throw Error("[" #method                                                                    \
                  "] bool operands are not reduced; convert first, e.g. "                        \
                  "astype(x, DType::i32)");                                                      \
    }                                                                                            \
    Prepared p = prepare(*state_, x, axes, #method);                                             \
    coll::Call c =                                                                               \
        base_call(coll::Kind::kind, x, *p.layout, options, *state_->launch, state_->pos);        \
    DType od = coll::Kind::kind == coll::Kind::pmean ? coll::pmean_dtype(x.dtype()) : x.dtype(); \
    auto [pending, out] = begin(*state_->launch, state_->pos, *p.layout, c, x, x.shape(), od);   \
    coll::finish(pending);                                                                       \
    return tr(out);                                                                              \
  }
MESHRT_REDUCTION(psum, psum)
MESHRT_REDUCTION(pmean, pmean)
MESHRT_REDUCTION(pmax, pmax)
MESHRT_REDUCTION(pmin, pmin)
#undef MESHRT_REDUCTION

namespace {

struct GatherPlan {
  coll::Call call;
  Shape out_shape;
};

GatherPlan plan_all_gather(int64_t pos, const Tensor& x, const coll::GroupLayout& layout, int axis,
                           bool tiled, int64_t n, const CollectiveOptions& options,
                           const detail::Launch& launch) {
  GatherPlan g{base_call(coll::Kind::all_gather, x, layout, options, launch, pos), x.shape()};
  const auto rank = static_cast<int64_t>(x.shape().size());
  if (tiled) {
    int64_t a = detail::normalize_axis(axis, rank, "all_gather", x.shape(), detail::Form::array);
    g.out_shape[static_cast<size_t>(a)] *= n;
    g.call.axis = a;
  } else {
    int64_t a =
        detail::normalize_axis(axis, rank + 1, "all_gather", x.shape(), detail::Form::array);
    g.out_shape.insert(g.out_shape.begin() + a, n);
    g.call.axis = a;
  }
  g.call.tiled = tiled;
  return g;
}

GatherPlan plan_ppermute(int64_t pos, const Tensor& x, const coll::GroupLayout& layout,
                         const detail::Launch& launch,
                         const std::vector<std::pair<int64_t, int64_t>>& perm, int64_t n) {
  const Mesh& mesh = launch.mesh;
  const std::vector<std::string>& names = layout.axis_names;
  // JAX: axes must be in mesh order for ppermute (it used to sort silently: wrong answers).
  for (size_t i = 1; i < names.size(); ++i) {
    if (mesh.axis_position(names[i - 1]) > mesh.axis_position(names[i])) {
      throw Error(
          cat("[ppermute] Make sure that the axis_name passed to ppermute is in the same order "
              "as the axis_names declared on the mesh: got ",
              axes_tuple(names), " for mesh axes ", axes_tuple(mesh.axis_names())));
    }
  }
  GatherPlan g{base_call(coll::Kind::ppermute, x, layout, {}, launch, pos), x.shape()};
  std::set<int64_t> srcs, dsts;
  bool unique = true;
  for (auto [s, d] : perm) {
    int64_t sm = ((s % n) + n) % n, dm = ((d % n) + n) % n;  // Python's %, as JAX
    unique &= srcs.insert(sm).second;
    unique &= dsts.insert(dm).second;
    g.call.perm.emplace_back(sm, dm);
  }
  if (!unique) {
    std::string s = "(";
    for (size_t i = 0; i < perm.size(); ++i) {
      s += cat(i ? ", " : "", "(", perm[i].first, ", ", perm[i].second, ")");
    }
    s += perm.size() == 1 ? ",)" : ")";
    throw Error(cat("[ppermute] ppermute sources and destinations must be unique, got ", s, "."));
  }
  return g;
}

}  // namespace

Tensor Context::all_gather(const Tensor& x, const AxisNames& axes, int axis, bool tiled,
                           const CollectiveOptions& options) {
  detail::Traced<Tensor> tr(detail::OpId::all_gather, {&x});
  if (tr) tr.set_attrs(detail::GatherAttrs{axes.names(), axis, tiled, how_of(options)});
  return tr(all_gather_start(x, axes, axis, tiled, options).wait());
}

PendingTensor Context::all_gather_start(const Tensor& x, const AxisNames& axes, int axis,
                                        bool tiled, const CollectiveOptions& options) {
  detail::check_host_read(x, "all_gather_start");
  Prepared p = prepare(*state_, x, axes, "all_gather");
  GatherPlan g = plan_all_gather(state_->pos, x, *p.layout, axis, tiled, p.group_size, options,
                                 *state_->launch);
  auto [pending, out] =
      begin(*state_->launch, state_->pos, *p.layout, g.call, x, g.out_shape, x.dtype());
  return PendingTensor(std::make_unique<detail::PendingState>(
      detail::PendingState{state_->launch, std::move(pending), std::move(out)}));
}

Tensor Context::ppermute(const Tensor& x, const AxisNames& axes,
                         const std::vector<std::pair<int64_t, int64_t>>& perm) {
  detail::Traced<Tensor> tr(detail::OpId::ppermute, {&x});
  if (tr) tr.set_attrs(detail::PpermuteAttrs{axes.names(), perm});
  return tr(ppermute_start(x, axes, perm).wait());
}

PendingTensor Context::ppermute_start(const Tensor& x, const AxisNames& axes,
                                      const std::vector<std::pair<int64_t, int64_t>>& perm) {
  detail::check_host_read(x, "ppermute_start");
  Prepared p = prepare(*state_, x, axes, "ppermute");
  GatherPlan g = plan_ppermute(state_->pos, x, *p.layout, *state_->launch, perm, p.group_size);
  auto [pending, out] =
      begin(*state_->launch, state_->pos, *p.layout, g.call, x, g.out_shape, x.dtype());
  return PendingTensor(std::make_unique<detail::PendingState>(
      detail::PendingState{state_->launch, std::move(pending), std::move(out)}));
}

Tensor Context::psum_scatter(const Tensor& x, const AxisNames& axes, int scatter_dimension,
                             bool tiled, const CollectiveOptions& options) {
  detail::Traced<Tensor> tr(detail::OpId::psum_scatter, {&x});
  if (tr)
    tr.set_attrs(detail::GatherAttrs{axes.names(), scatter_dimension, tiled, how_of(options)});
  Prepared p = prepare(*state_, x, axes, "psum_scatter");
  const int64_t n = p.group_size;
  const auto rank = static_cast<int64_t>(x.shape().size());
  const int64_t sd = detail::normalize_axis(scatter_dimension, rank, "psum_scatter", x.shape(),
                                            detail::Form::array);
  const int64_t size = x.shape()[static_cast<size_t>(sd)];
  Shape out_shape = x.shape();
  if (tiled) {
    if (size % n != 0) {
      throw Error(cat("[psum_scatter] tiled psum_scatter splits dimension ", sd, " (size ", size,
                      ") into one piece per device of ", axes_text(axes), ", but ", n,
                      " devices do not evenly divide ", size,
                      "; pick a scatter_dimension or axes whose size divides it"));
    }
    out_shape[static_cast<size_t>(sd)] = size / n;
  } else {
    if (size != n) {
      throw Error(cat("[psum_scatter] untiled psum_scatter gives each device of ", axes_text(axes),
                      " one index of dimension ", sd, ", so its size (", size,
                      ") must equal the number of devices (", n, "); pass tiled = true to split ",
                      "it into blocks instead"));
    }
    out_shape.erase(out_shape.begin() + sd);
  }
  coll::Call c =
      base_call(coll::Kind::psum_scatter, x, *p.layout, options, *state_->launch, state_->pos);
  c.axis = sd;
  c.tiled = tiled;
  auto [pending, out] = begin(*state_->launch, state_->pos, *p.layout, c, x, out_shape, x.dtype());
  coll::finish(pending);
  return tr(out);
}

Tensor Context::all_to_all(const Tensor& x, const AxisNames& axes, int split_axis, int concat_axis,
                           bool tiled, const CollectiveOptions& options) {
  detail::Traced<Tensor> tr(detail::OpId::all_to_all, {&x});
  if (tr)
    tr.set_attrs(
        detail::AllToAllAttrs{axes.names(), split_axis, concat_axis, tiled, how_of(options)});
  Prepared p = prepare(*state_, x, axes, "all_to_all");
  const int64_t n = p.group_size;
  const auto rank = static_cast<int64_t>(x.shape().size());
  const int64_t split =
      detail::normalize_axis(split_axis, rank, "all_to_all", x.shape(), detail::Form::array);
  const int64_t concat =
      detail::normalize_axis(concat_axis, rank, "all_to_all", x.shape(), detail::Form::array);
  const int64_t size = x.shape()[static_cast<size_t>(split)];
  Shape out_shape = x.shape();
  if (tiled) {
    if (size % n != 0) {
      throw Error(cat("[all_to_all] The size of all_to_all split_axis (", size,
                      ") has to be divisible by the size of the named axis ",
                      axes_tuple(p.layout->axis_names), " (", n, ")"));
    }
    out_shape[static_cast<size_t>(split)] /= n;
    out_shape[static_cast<size_t>(concat)] *= n;
  } else {
    if (size != n) {
      throw Error(cat("[all_to_all] all_to_all requires the size of the mapped axis ",
                      axes_tuple(p.layout->axis_names),
                      " to equal x.shape[split_axis], but they are ", n, " and ", size,
                      " respectively."));
    }
    out_shape.erase(out_shape.begin() + split);
    out_shape.insert(out_shape.begin() + concat, n);
  }
  coll::Call c =
      base_call(coll::Kind::all_to_all, x, *p.layout, options, *state_->launch, state_->pos);
  c.axis = split;
  c.axis2 = concat;
  c.tiled = tiled;
  auto [pending, out] = begin(*state_->launch, state_->pos, *p.layout, c, x, out_shape, x.dtype());
  coll::finish(pending);
  return tr(out);
}

PendingTensor::PendingTensor() = default;
PendingTensor::PendingTensor(std::unique_ptr<detail::PendingState> state)
    : state_(std::move(state)) {}
PendingTensor::PendingTensor(PendingTensor&&) noexcept = default;
PendingTensor& PendingTensor::operator=(PendingTensor&&) noexcept = default;
PendingTensor::~PendingTensor() = default;
bool PendingTensor::valid() const { return state_ && state_->pending.valid(); }

Tensor PendingTensor::wait() {
  if (!valid())
    throw Error("[collectives] wait() on a PendingTensor that was already waited for or is empty");
  coll::finish(state_->pending);
  Tensor out = std::move(state_->out);
  state_.reset();
  return out;
}

}  // namespace meshrt
