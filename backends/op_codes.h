// backends/op_codes.h: the backend's op vocabulary, defined once for the C++ side (backend.h)
// and the CUDA kernels (cuda_kernels.cu, compiled by nvcc as C++17): plain C++17, no vendor
// header. Kernels templated on an int take code(op), never a literal, so a reordered enum
// changes every kernel with it; the static_asserts below and in the .cu hold the places that must
// agree on numbers (scalar_ops.h's UnaryCode, the kernels' comparison split) to these enums.
#pragma once

// code() in device code too (nvcc; a plain constexpr function is host-only there).
#if defined(__CUDACC__)
#define MESHRT_OP_CODE_HD __host__ __device__
#else
#define MESHRT_OP_CODE_HD
#endif

namespace meshrt::backend {

enum class UnaryOp { copy, neg, exp, log, sin, cos, tanh, sqrt, relu };
enum class BinaryOp { add, sub, mul, div, max, min, eq, ne, lt, le, gt, ge };
enum class ReduceOp { sum, max, min, argmax };
// How a collective combines members' data: mean = sum, then divided by the member count in the
// output dtype (int32 -> float32, int64 -> float64, as pmean).
enum class FoldOp { sum, max, min, mean };

MESHRT_OP_CODE_HD constexpr int code(UnaryOp op) { return static_cast<int>(op); }
MESHRT_OP_CODE_HD constexpr int code(BinaryOp op) { return static_cast<int>(op); }
MESHRT_OP_CODE_HD constexpr int code(ReduceOp op) { return static_cast<int>(op); }
MESHRT_OP_CODE_HD constexpr int code(FoldOp op) { return static_cast<int>(op); }

// Comparisons are the ops from eq on: they write bool (the kernels pick their output type so).
MESHRT_OP_CODE_HD constexpr bool is_comparison(BinaryOp op) {
  return code(op) >= code(BinaryOp::eq);
}
static_assert(code(BinaryOp::ge) == code(BinaryOp::eq) + 5, "comparisons are eq .. ge, last");

}  // namespace meshrt::backend
