// collectives/reduce.h: the dtype rule of pmean (the folds themselves are the backends'
// collective primitives: backends/cpu/coll_primitives.h on cpu, reduction kernels on cuda).
#pragma once

#include "core/dtype.h"

namespace meshrt::coll {

// The dtype pmean returns for an input dtype: floats keep theirs; int32 -> float32, int64 ->
// float64.
DType pmean_dtype(DType in);

}  // namespace meshrt::coll
