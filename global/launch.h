// global/launch.h: the per-device launch of one global-view op, and the one observer every
// launch reports to (not installed).
//
// An op that needs no collective runs its blocks from the caller's thread (`run_local`); one
// with collectives runs as a shard_map body (`run_blocks`). Both, and every reshard the planner
// makes (global/reshard.h), tell the observer installed on the calling thread what ran: jit's
// recorder is that observer while a trace records (global/jit_record.cpp).
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "global/collective_log.h"
#include "global/layout.h"
#include "runtime/array.h"
#include "runtime/context.h"
#include "runtime/mesh.h"
#include "runtime/sharding.h"

namespace meshrt::detail {
// The CollectiveLog's writer: the launches and reshards of the global view report each collective
// they insert.
struct CollectiveLogAccess {
  static void add(CollectiveLog::Entry entry) { CollectiveLog::add(std::move(entry)); }
};
}  // namespace meshrt::detail

namespace meshrt::global {

// A device's part of an op with collectives: its blocks in, its result blocks out.
using Body = std::function<std::vector<Tensor>(Context&, const std::vector<Tensor>&)>;
// A device's part of an op without collectives.
using LocalFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// What the launches report, on the thread that made them. Each call happens after the launch
// ran, with its operands' blocks as the launch read them and its results: the Arrays the launch
// returns, which the observer may name (jit's recorder gives their blocks trace ids,
// detail::ArrayAccess::set_block_trace_id) but not otherwise change.
class LaunchObserver {
 public:
  virtual ~LaunchObserver() = default;
  // run_local ran `fn` on the blocks of `placed`, giving `outs` (`concurrent`: run_blocks ran it
  // on every device's executor at once, as it does for large blocks).
  virtual void launched_local(const Mesh& mesh, const std::vector<Array>& placed, const LocalFn& fn,
                              std::vector<Array>& outs, bool concurrent) = 0;
  // run_blocks ran `body` (collectives inside) on the blocks of `placed`, giving `outs`; `psum`:
  // the body is exactly a psum of its one operand over these axes (else null).
  virtual void launched_blocks(const Mesh& mesh, const std::vector<Array>& placed, const Body& body,
                               std::vector<Array>& outs, const AxisList* psum) = 0;
  // device_put(in, to) gave `out` (a reshard made from the caller's thread).
  virtual void resharded(const Array& in, const Sharding& to, Array& out) = 0;
};

// The observer installed on this thread, or null (then launches report nothing: one
// thread-local load each).
LaunchObserver* launch_observer();
// Installs `o` (null: none) on this thread and returns the previous one (restore it when done).
LaunchObserver* set_launch_observer(LaunchObserver* o);

// `x`'s blocks as they are, pending addends included, as an Array without pending sums (what a
// launch hands each device).
Array raw_addends(const Array& x);

// What jit may know of a body besides running it: the device-local function it wraps (no
// collective inside), or that it is exactly a psum of its one operand over `psum`.
struct BodyIs {
  const LocalFn* local = nullptr;
  const AxisList* psum = nullptr;
};
// Runs `body` on every device with the blocks of `placed` (whose layouts are `in`) and assembles
// the results with layouts `out` (pending sums included).
std::vector<Array> run_blocks(const Mesh& mesh, const std::vector<Array>& placed,
                              const std::vector<Layout>& in, const std::vector<Layout>& out,
                              const std::vector<Shape>& out_shapes, const Body& body,
                              BodyIs is = {});

// The same for ops that need no collective: each device's blocks are computed by calling
// `fn` from the caller's thread (the Tensor ops run on the blocks' devices, as outside
// shard_map), so one launch costs a few microseconds per device instead of waking executors.
std::vector<Array> run_local(const Mesh& mesh, const std::vector<Array>& placed,
                             const std::vector<Layout>& out, const std::vector<Shape>& out_shapes,
                             const LocalFn& fn);

}  // namespace meshrt::global
