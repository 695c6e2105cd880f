#include "global/reshard.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"
#include "core/strings.h"
#include "global/collective_log.h"
#include "global/launch.h"
#include "global/sharding_mode.h"
#include "runtime/detail/access.h"

namespace meshrt::global {

using detail::cat;

namespace {

std::string sharding_text(const Sharding& s) {
  const std::optional<NamedSharding> named = s.as_named();
  if (!named) return s.str();
  return named->mesh().str() + " " + named->spec().str();
}

int64_t block_bytes(const Array& x) {
  for (const Tensor& t : detail::ArrayAccess::blocks(x)) {  // the first this process holds
    if (t.valid()) return static_cast<int64_t>(t.nbytes());
  }
  return 0;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sums the pending addends of `x`: psum_scatter for partial axes `to` appends to a dimension
// right after that dimension's current axes, psum over the rest.
Array reshard_summed(const Array& sum, const Mesh& mesh, const Layout& to, std::string_view op,
                     const std::string& note);

Array resolve(const Array& x, const Mesh& mesh, const Layout& to, std::string_view op,
              const std::string& note) {
  if (const Array* sum = meshrt::detail::value_elsewhere(x)) {
    // Already summed in another layout (a matmul computed as rows): moved, not summed.
    const std::string origin = meshrt::detail::pending_sum_origin(x);
    return reshard_summed(*sum, mesh, to, origin.empty() ? op : std::string_view(origin),
                          cat("the sum of a pending ", origin.empty() ? std::string(op) : origin,
                              " already taken as rows, moved at ",
                              op == "read" ? std::string("a read of the value") : std::string(op),
                              note.empty() ? "" : "; ", note));
  }
  Layout have = layout_of(x);
  Layout next = have;
  next.partial.clear();
  std::vector<std::pair<std::string, int>> scatters;  // (axis, dim) in order
  for (size_t d = 0; d < to.dims.size(); ++d) {
    if (!is_prefix(have.dims[d], to.dims[d])) continue;
    for (size_t k = have.dims[d].size(); k < to.dims[d].size(); ++k) {
      const std::string& a = to.dims[d][k];
      auto it = std::find(have.partial.begin(), have.partial.end(), a);
      if (it == have.partial.end()) break;
      scatters.emplace_back(a, static_cast<int>(d));
      next.dims[d].push_back(a);
    }
  }
  AxisList rest;
  for (const std::string& a : have.partial) {
    bool scattered =
        std::any_of(scatters.begin(), scatters.end(), [&](auto& s) { return s.first == a; });
    if (!scattered) rest.push_back(a);
  }
  const int64_t in_bytes = block_bytes(x);
  const auto t0 = std::chrono::steady_clock::now();
  Layout in = have;
  in.partial.clear();
  Shape shape = x.shape();
  std::vector<Array> out = run_blocks(mesh, {raw_addends(x)}, {in}, {next}, {shape},
                                      [scatters, rest](Context& ctx, const std::vector<Tensor>& b) {
                                        Tensor t = b[0];
                                        for (auto& [axis, dim] : scatters)
                                          t = ctx.psum_scatter(t, axis, dim, /*tiled=*/true);
                                        if (!rest.empty()) t = ctx.psum(t, AxisNames(rest));
                                        return std::vector<Tensor>{t};
                                      },
                                      {.psum = scatters.empty() ? &rest : nullptr});
  const double secs = since(t0);
  // Logged under the op that made the sum (`sum`, `matmul`, a gradient), saying where it is taken
  // now when that is later (a read, a constraint, a nonlinear op).
  const std::string origin = meshrt::detail::pending_sum_origin(x);
  std::string why = note;
  if (!origin.empty() && origin != op) {
    why = cat("summed at ", op == "read" ? std::string("a read of the value") : std::string(op),
              why.empty() ? "" : "; ", why);
  }
  const std::string by = origin.empty() ? std::string(op) : origin;
  // What each device sends and receives under the direct algorithm: psum_scatter, the n-1
  // pieces of its block that the others reduce (and theirs of its piece); psum, its addend out
  // and the sum back (the block's bytes: 4 for a float32 scalar).
  int64_t bytes = in_bytes;
  for (auto& [axis, dim] : scatters) {
    const int64_t n = mesh.axis_size(axis);
    detail::CollectiveLogAccess::add({by, "psum_scatter", "direct", layout_str(have),
                                      layout_str(next), bytes * (n - 1) / n, secs, why});
    bytes /= n;
  }
  if (!rest.empty()) {
    detail::CollectiveLogAccess::add(
        {by, "psum", "direct", layout_str(have), layout_str(next), bytes, secs, why});
  }
  return out.front();
}

}  // namespace

OpMesh op_mesh(std::string_view op, const std::vector<const Array*>& xs) {
  const Array* first = nullptr;
  for (const Array* x : xs) {
    if (!x->valid()) {  // not blocks(): that would make a deferred value's blocks
      throw Error(
          cat("[", op, "] an operand is an empty (default-constructed or moved-from) Array"));
    }
    if (first == nullptr) {
      first = x;
      continue;
    }
    const Sharding& a = first->sharding();
    const Sharding& b = x->sharding();
    if (!a.same_domain(b)) {
      throw Error(cat("[", op, "] operands live on different ",
                      a.platform() != b.platform() ? "platforms" : "meshes", ": ", sharding_text(a),
                      " and ", sharding_text(b),
                      "; device_put one of them onto the other's sharding "
                      "(device_put(y, x.sharding()))"));
    }
  }
  const Sharding& s = first->sharding();
  if (const std::optional<NamedSharding> named = s.as_named()) return OpMesh{named->mesh(), false};
  return OpMesh{Mesh({s.device_list().front()}, {1}, {"_device"}), true};
}

Array on_mesh(const Array& x, const OpMesh& m) {
  if (!m.single) return x;
  return detail::ArrayAccess::make(x.shape(), x.dtype(), NamedSharding(m.mesh, P()),
                                   detail::ArrayAccess::blocks(x), x.pending_sum_axes());
}

Array off_mesh(const Array& y, const OpMesh& m) {
  if (!m.single) return y;
  return detail::ArrayAccess::make(y.shape(), y.dtype(),
                                   SingleDeviceSharding(m.mesh.devices().front()),
                                   detail::ArrayAccess::blocks(y));
}

Array reshard(const Array& x, const Mesh& mesh, const Layout& to, std::string_view op,
              bool implicit, const std::string& note, std::string_view operand) {
  Array cur = x;
  Layout have = layout_of(cur);
  const Array* kept = meshrt::detail::value_elsewhere(x);
  if (kept != nullptr && have.partial.empty() && have.dims != to.dims) {
    // A value kept in another layout (a matmul computed as rows): moved from there, once.
    return reshard(*kept, mesh, to, op, implicit, note, operand);
  }
  if (!have.partial.empty()) {
    cur = resolve(cur, mesh, to, op, note);
    have = layout_of(cur);
  }
  if (have.dims == to.dims) return cur;
  if (implicit && sharding_mode() == ShardingMode::explicit_) {
    throw Error(cat("[", op, "] explicit sharding mode: ",
                    operand.empty() ? std::string("the operand") : std::string(operand),
                    " of shape ", shape_str(x.shape()), " sharded as ", spec_of(have).str(),
                    " would have to be resharded to ", spec_of(to).str(), " on ", mesh.str(),
                    "; reshard it yourself (with_sharding_constraint(x, NamedSharding(mesh, ",
                    spec_of(to).str(),
                    ")) or device_put), or pass out_sharding= to choose the "
                    "result's sharding"));
  }
  // What changes, per mesh axis: where it was and where it goes.
  auto where = [](const Layout& l, const std::string& a) {
    for (size_t d = 0; d < l.dims.size(); ++d) {
      if (std::find(l.dims[d].begin(), l.dims[d].end(), a) != l.dims[d].end())
        return static_cast<int>(d);
    }
    return -1;
  };
  int64_t gathered = 1, moved = 1;
  for (const std::string& a : mesh.axis_names()) {
    const int from = where(have, a), dest = where(to, a);
    if (from >= 0 && dest < 0) gathered *= mesh.axis_size(a);
    if (from >= 0 && dest >= 0 && from != dest) moved *= mesh.axis_size(a);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const NamedSharding target(mesh, spec_of(to));
  Array out = device_put(cur, target);
  const double secs = since(t0);
  if (LaunchObserver* o = launch_observer()) o->resharded(cur, target, out);
  const int64_t out_bytes = block_bytes(out);
  if (moved > 1) {
    detail::CollectiveLogAccess::add({std::string(op), "all_to_all", "copy", layout_str(have),
                                      layout_str(to), out_bytes * (moved - 1) / moved, secs, note});
  }
  if (gathered > 1) {
    detail::CollectiveLogAccess::add({std::string(op), "all_gather", "copy", layout_str(have),
                                      layout_str(to), out_bytes * (gathered - 1) / gathered, secs,
                                      note});
  }
  return out;
}

Array place(const Array& x, const Mesh& mesh, const Layout& need, std::string_view op,
            size_t index) {
  const Layout have = layout_of(x);
  if (!need.partial.empty()) {
    // Rules keep a pending sum only where the operand already has exactly that layout.
    MESHRT_DCHECK(have.partial == need.partial && have.dims == need.dims);
    return raw_addends(x);
  }
  return reshard(x, mesh, need, op, /*implicit=*/true, "", cat("args[", index, "]"));
}

namespace {
Array reshard_summed(const Array& sum, const Mesh& mesh, const Layout& to, std::string_view op,
                     const std::string& note) {
  Layout dims = to;
  dims.partial.clear();
  return reshard(sum, mesh, dims, op, /*implicit=*/false, note);
}
}  // namespace

}  // namespace meshrt::global
