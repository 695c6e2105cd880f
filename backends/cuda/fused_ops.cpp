// The cuda backend's fused elementwise pairs (Backend::binary_unary, Backend::compare_select):
// one kernel from fused_kernels.cu where the walk merges to at most two dimensions and the dtypes
// are float32/float64; otherwise the default (the two kernels through a temporary).
#include <cuda_runtime.h>

#include <optional>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fused_kernels.h"
#include "backends/merge_dims.h"

namespace meshrt::cuda {
namespace {

// The (rows, cols) walk of `shape` and each operand's two strides, or nothing past rank 2.
struct Walk {
  int64_t rows = 1, cols = 1;
  std::vector<Operand2> ops;
};
std::optional<Walk> walk2(const std::vector<int64_t>& shape,
                          const std::vector<const backend::Strided*>& in) {
  std::vector<const std::vector<int64_t>*> strides;
  for (const backend::Strided* s : in) strides.push_back(&s->strides);
  const backend::MergedDims m = backend::merge_dims(shape, strides);
  if (m.size.size() > 2) return std::nullopt;
  Walk w;
  const size_t r = m.size.size();
  if (r >= 1) w.cols = m.size[r - 1];
  if (r == 2) w.rows = m.size[0];
  for (size_t i = 0; i < in.size(); ++i) {
    Operand2 o;
    o.data = in[i]->data;
    if (r >= 1) o.s1 = m.strides[i][r - 1];
    if (r == 2) o.s0 = m.strides[i][0];
    w.ops.push_back(o);
  }
  return w;
}

bool fusable(DType t) { return t == DType::f32 || t == DType::f64; }

}  // namespace

void CudaBackend::binary_unary(int device, backend::BinaryOp bop, backend::UnaryOp uop, DType dtype,
                               const std::vector<int64_t>& shape, const backend::Strided& a,
                               const backend::Strided& b, void* y) {
  const std::optional<Walk> w = fusable(dtype) ? walk2(shape, {&a, &b}) : std::nullopt;
  if (!w || backend::is_comparison(bop)) {
    Backend::binary_unary(device, bop, uop, dtype, shape, a, b, y);
    return;
  }
  set(device);
  MESHRT_CUDA_CHECK(launch_binary_unary(ops_stream(device), backend::code(bop), backend::code(uop),
                                        dtype, w->rows, w->cols, w->ops[0], w->ops[1], y),
                    device);
}

void CudaBackend::compare_select(int device, backend::BinaryOp cmp, DType in, DType dtype,
                                 const std::vector<int64_t>& shape, const backend::Strided& x0,
                                 const backend::Strided& x1, const backend::Strided& a,
                                 const backend::Strided& b, void* y) {
  const std::optional<Walk> w =
      fusable(in) && fusable(dtype) ? walk2(shape, {&x0, &x1, &a, &b}) : std::nullopt;
  if (!w || !backend::is_comparison(cmp)) {
    Backend::compare_select(device, cmp, in, dtype, shape, x0, x1, a, b, y);
    return;
  }
  set(device);
  MESHRT_CUDA_CHECK(
      launch_compare_select(ops_stream(device), backend::code(cmp), in, dtype, w->rows, w->cols,
                            w->ops[0], w->ops[1], w->ops[2], w->ops[3], y),
      device);
}

}  // namespace meshrt::cuda
