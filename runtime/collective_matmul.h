// runtime/collective_matmul.h: collective matmul, the seed program of JAX's shard_map tutorial.
//
// For a mesh axis of size N:
//   all-gather matmul       lhs sharded on rows (P(axis, None)), rhs sharded on rows:
//                           out = lhs @ rhs, sharded on rows.
//   matmul reduce-scatter   lhs sharded on columns (P(None, axis)), rhs sharded on rows:
//                           out = lhs @ rhs, sharded on rows.
// Variants: naive (all_gather then matmul / matmul then psum_scatter), overlapped (a ring of
// ppermutes, one local matmul per step on the matching dynamic_slice_in_dim block, the next shift
// started before the matmul so they overlap), bidirectional (halves travelling both ways).
//
//   Tensor out = collective_matmul::allgather_matmul(ctx, lhs_block, rhs_block, "x",
//                                                    collective_matmul::Variant::bidirectional);
#pragma once

#include <string>

#include "runtime/array.h"
#include "runtime/shard_map.h"
#include "runtime/tensor.h"

namespace meshrt::collective_matmul {

// How the collective and the local matmuls are arranged (the file comment describes each).
enum class Variant {
  naive,          // one whole collective, then (or before) one matmul
  overlapped,     // a one-way ring of ppermutes overlapped with per-block matmuls
  bidirectional,  // the ring with half of each block travelling each way
};
// "naive", "overlapped" or "bidirectional".
const char* variant_name(Variant v);

// Inside a body. lhs_block: (m/N, k); rhs_block: (k/N, n); returns (m/N, n).
Tensor allgather_matmul(Context& ctx, const Tensor& lhs_block, const Tensor& rhs_block,
                        const std::string& axis, Variant variant);
// Inside a body. lhs_block: (m, k/N); rhs_block: (k/N, n); returns (m/N, n).
Tensor matmul_reduce_scatter(Context& ctx, const Tensor& lhs_block, const Tensor& rhs_block,
                             const std::string& axis, Variant variant);

// The whole program: shard_map over `mesh` with the specs above; inputs are resharded as needed.
Array allgather_matmul(const Array& lhs, const Array& rhs, const Mesh& mesh,
                       const std::string& axis, Variant variant);
// The whole program of the matmul reduce-scatter: lhs is resharded to P(None, axis), rhs to
// P(axis, None); the result is sharded on rows, P(axis, None).
Array matmul_reduce_scatter(const Array& lhs, const Array& rhs, const Mesh& mesh,
                            const std::string& axis, Variant variant);

}  // namespace meshrt::collective_matmul
