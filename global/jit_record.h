// global/jit_record.h: where the global view's launches report to a jit trace (not installed).
// Each call is a no-op (one thread-local load) unless a JitTrace is recording on this thread.
#pragma once

#include <vector>

#include "global/reshard.h"
#include "runtime/array.h"
#include "runtime/mesh.h"
#include "runtime/sharding.h"

namespace meshrt::detail {

// run_local ran `fn` on the blocks of `placed`, giving `outs` (`concurrent`: run_blocks ran it on
// every device's executor at once, as it does for large blocks).
void jit_record_local(const Mesh& mesh, const std::vector<Array>& placed, const global::LocalFn& fn,
                      const std::vector<Array>& outs, bool concurrent);
// run_blocks ran `body` (collectives inside) on the blocks of `placed`, giving `outs`; `psum`: the
// body is exactly a psum of its one operand over these axes (else null).
void jit_record_blocks(const Mesh& mesh, const std::vector<Array>& placed, const global::Body& body,
                       const std::vector<Array>& outs, const global::AxisList* psum);
// device_put(in, to) gave `out` (a reshard made from the caller's thread).
void jit_record_reshard(const Array& in, const Sharding& to, const Array& out);

}  // namespace meshrt::detail
