// collectives/reduce.h: elementwise reductions over several host buffers (cpu data path).
//
// The fold order is fixed: ((x_0 op x_1) op x_2) ... in group-index order, the same for every
// element and whichever device computes it, so every device gets bit-identical results.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/fingerprint.h"

namespace meshrt::coll {

// dst[e] = fold(op, srcs[0][e] .. srcs[n-1][e]) for e < len; for pmean then divided by n in
// out_dtype (integer inputs give floats, as jnp.true_divide). in/out dtypes are the Call's.
void reduce_run(Kind op, DType in, DType out, void* dst, const std::vector<const void*>& srcs,
                int64_t len);

// dst = sum / divisor in out dtype (pmean's last step after a ring sum in the input dtype).
void mean_from_sum(DType in, DType out, void* dst, const void* sum, int64_t len, int64_t divisor);

// The dtype pmean returns for an input dtype: floats keep theirs; int32 -> float32, int64 ->
// float64.
DType pmean_dtype(DType in);

}  // namespace meshrt::coll
