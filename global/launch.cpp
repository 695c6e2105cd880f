#include "global/launch.h"

#include <optional>

#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/access.h"
#include "runtime/detail/launch.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/trace.h"
#include "runtime/shard_map.h"

namespace meshrt::global {

using detail::cat;

namespace {
thread_local LaunchObserver* t_observer = nullptr;
}  // namespace

LaunchObserver* launch_observer() { return t_observer; }

LaunchObserver* set_launch_observer(LaunchObserver* o) {
  LaunchObserver* previous = t_observer;
  t_observer = o;
  return previous;
}

Array raw_addends(const Array& x) {
  return detail::ArrayAccess::make(x.shape(), x.dtype(), x.sharding(),
                                   detail::ArrayAccess::blocks(x));
}

std::vector<Array> run_blocks(const Mesh& mesh, const std::vector<Array>& placed,
                              const std::vector<Layout>& in, const std::vector<Layout>& out,
                              const std::vector<Shape>& out_shapes, const Body& body, BodyIs is) {
  std::vector<PartitionSpec> in_specs, out_specs;
  for (const Layout& l : in) in_specs.push_back(spec_of(l));
  for (const Layout& l : out) out_specs.push_back(spec_of(l));
  std::vector<Array> args;
  for (const Array& a : placed) args.push_back(raw_addends(a));
  std::vector<Array> got;
  {
    const meshrt::detail::Untraced untraced;  // the global view's own launch, not the user's
    got = meshrt::detail::run_shard_map(body, mesh, in_specs, out_specs, args,
                                        {.check_replication = false});
  }
  std::vector<Array> res;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].shape() != out_shapes[i]) {
      throw Error(cat("[global] internal: a rule promised shape ", shape_str(out_shapes[i]),
                      " but the blocks assemble to ", shape_str(got[i].shape())));
    }
    res.push_back(out[i].partial.empty()
                      ? got[i]
                      : detail::ArrayAccess::make(got[i].shape(), got[i].dtype(), got[i].sharding(),
                                                  detail::ArrayAccess::blocks(got[i]),
                                                  out[i].partial));
  }
  if (LaunchObserver* o = t_observer) {
    if (is.local != nullptr) {
      o->launched_local(mesh, args, *is.local, res, /*concurrent=*/true);
    } else {
      o->launched_blocks(mesh, args, body, res, is.psum);
    }
  }
  return res;
}

std::vector<Array> run_local(const Mesh& mesh, const std::vector<Array>& placed,
                             const std::vector<Layout>& out, const std::vector<Shape>& out_shapes,
                             const LocalFn& fn) {
  const size_t n = static_cast<size_t>(mesh.size());
  std::vector<std::vector<Tensor>> blocks(out.size(), std::vector<Tensor>(n));
  std::vector<Tensor> args(placed.size());
  std::optional<size_t> first;  // the first position this process holds
  for (size_t pos = 0; pos < n; ++pos) {
    if (mesh.devices()[pos].process_index() != process_index()) continue;  // another process's
    if (!first) first = pos;
    for (size_t j = 0; j < placed.size(); ++j)
      args[j] = detail::ArrayAccess::blocks(placed[j])[pos];
    std::vector<Tensor> r = fn(args);
    MESHRT_DCHECK(r.size() == out.size());
    for (size_t o = 0; o < r.size(); ++o) blocks[o][pos] = std::move(r[o]);
  }
  std::vector<Array> res;
  if (!first) {
    throw Error(cat("[global] this process (", process_index(),
                    ") holds no device of the operands' mesh; every process must hold some"));
  }
  for (size_t o = 0; o < out.size(); ++o) {
    const DType dt = blocks[o][*first].dtype();
    res.push_back(detail::ArrayAccess::make(out_shapes[o], dt, NamedSharding(mesh, spec_of(out[o])),
                                            std::move(blocks[o]), out[o].partial));
  }
  if (LaunchObserver* o = t_observer)
    o->launched_local(mesh, placed, fn, res, /*concurrent=*/false);
  return res;
}

}  // namespace meshrt::global
