#include "collectives/plane.h"

#include <cstring>

#include "collectives/reduce.h"

namespace meshrt::coll {

backend::FoldOp fold_op(Kind k) {
  switch (k) {
    case Kind::pmax:
      return backend::FoldOp::max;
    case Kind::pmin:
      return backend::FoldOp::min;
    case Kind::pmean:
      return backend::FoldOp::mean;
    default:
      return backend::FoldOp::sum;
  }
}

void Plane::copy(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return;
  if (be_) {
    be_->coll_copy_2d(device_, dst, bytes, src, bytes, bytes, 1);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

void Plane::copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t height) const {
  if (width == 0 || height == 0) return;
  if (be_) {
    be_->coll_copy_2d(device_, dst, dpitch, src, spitch, width, height);
    return;
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t r = 0; r < height; ++r) std::memcpy(d + r * dpitch, s + r * spitch, width);
}

void Plane::zero(void* dst, size_t bytes) const {
  if (bytes == 0) return;
  if (be_) {
    be_->coll_zero(device_, dst, bytes);
  } else {
    std::memset(dst, 0, bytes);
  }
}

void Plane::fold(Kind op, DType in, DType out, void* dst, const std::vector<const void*>& srcs,
                 int64_t len) const {
  if (len == 0) return;
  if (be_) {
    be_->coll_fold(device_, fold_op(op), in, out, dst, srcs, len);
  } else {
    reduce_run(op, in, out, dst, srcs, len);
  }
}

void Plane::fold_rows(Kind op, DType dtype, void* dst, int64_t dpitch,
                      const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                      int64_t rows) const {
  if (len == 0 || rows == 0) return;
  if (be_) {
    be_->coll_fold_rows(device_, fold_op(op), dtype, dst, dpitch, srcs, spitch, len, rows);
    return;
  }
  const auto e = static_cast<int64_t>(dtype_size(dtype));
  std::vector<const void*> row(srcs.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < srcs.size(); ++j)
      row[j] = static_cast<const char*>(srcs[j]) + r * spitch * e;
    reduce_run(op, dtype, dtype, static_cast<char*>(dst) + r * dpitch * e, row, len);
  }
}

void Plane::mean_from_sum(DType in, DType out, void* dst, const void* sum, int64_t len,
                          int64_t divisor) const {
  if (len == 0) return;
  if (be_) {
    be_->coll_mean(device_, in, out, dst, sum, len, divisor);
  } else {
    coll::mean_from_sum(in, out, dst, sum, len, divisor);
  }
}

}  // namespace meshrt::coll
