// global/reshard.h: the reshard planner and the per-device launch of one global-view op
// (not installed).
//
// Reshards, by what changes per mesh axis (each inserted collective is logged):
//   pending sum -> sharded on a dim      psum_scatter (when the axis is appended to that dim)
//   pending sum -> replicated            psum
//   sharded     -> replicated            all_gather
//   dim d       -> dim e                 all_to_all
//   replicated  -> sharded               a local slice (no communication, not logged)
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "global/layout.h"
#include "runtime/context.h"
#include "runtime/shard_map.h"

namespace meshrt::global {

// The mesh an op runs on: its operands' common mesh, or a one-device mesh for operands on one
// device (SingleDeviceSharding). Operands elsewhere are an Error naming both and the fix.
struct OpMesh {
  Mesh mesh;
  bool single = false;  // results go back to SingleDeviceSharding
};
OpMesh op_mesh(std::string_view op, const std::vector<const Array*>& xs);

// `x` on `m.mesh` (a single-device Array becomes replicated on the one-device mesh).
Array on_mesh(const Array& x, const OpMesh& m);
// Back from the one-device mesh to SingleDeviceSharding where `m.single`.
Array finish(const Array& y, const OpMesh& m);

// `x` resharded to `to` (which has no pending sums). `implicit`: the op chose this reshard on
// its own (an Error in ShardingMode::explicit_ when the layout changes, naming `operand`, e.g.
// "args[1]").
Array reshard(const Array& x, const Mesh& mesh, const Layout& to, std::string_view op,
              bool implicit, const std::string& note = "", std::string_view operand = {});

// The blocks of `x` as they are (pending addends included), placed as `need` asks: pending
// sums kept only where `need.partial` equals them, else resolved first.
// `index`: the operand's position in the op's arguments (named in explicit mode's error).
Array place(const Array& x, const Mesh& mesh, const Layout& need, std::string_view op,
            size_t index);

// Runs `body` on every device with the blocks of `placed` (whose layouts are `in`) and assembles
// the results with layouts `out` (pending sums included).
using Body = std::function<std::vector<Tensor>(Context&, const std::vector<Tensor>&)>;
using LocalFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
// What jit may know of a body besides running it (global/jit_record.h): the device-local function
// it wraps (no collective inside), or that it is exactly a psum of its one operand over `psum`.
struct BodyIs {
  const LocalFn* local = nullptr;
  const AxisList* psum = nullptr;
};
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
