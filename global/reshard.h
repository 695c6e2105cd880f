// global/reshard.h: the reshard planner of one global-view op (not installed); its launches are
// global/launch.h.
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
Array off_mesh(const Array& y, const OpMesh& m);

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

}  // namespace meshrt::global
