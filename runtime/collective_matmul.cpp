// Collective matmul variants, as in JAX's shard_map tutorial ("Collective matrix multiplication").
#include "runtime/collective_matmul.h"

#include "core/error.h"
#include "core/strings.h"
#include "runtime/tensor_ops.h"

namespace meshrt::collective_matmul {

using detail::cat;

namespace {

std::vector<std::pair<int64_t, int64_t>> shift_perm(int64_t n, int64_t by) {
  std::vector<std::pair<int64_t, int64_t>> p;
  for (int64_t i = 0; i < n; ++i) p.emplace_back(i, ((i + by) % n + n) % n);
  return p;
}

int64_t mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

void check_blocks(const char* fn, const Tensor& lhs, const Tensor& rhs, Variant v, int64_t n,
                  int64_t split_dim_size, const char* what) {
  if (lhs.ndim() != 2 || rhs.ndim() != 2) {
    throw Error(cat("[collective_matmul] ", fn, ": blocks must be 2-D, got ",
                    shape_str(lhs.shape()), " and ", shape_str(rhs.shape())));
  }
  const int64_t need = v == Variant::bidirectional ? 2 * n : n;
  if (v != Variant::naive && split_dim_size % need != 0) {
    throw Error(cat("[collective_matmul] ", fn, " (", variant_name(v), "): ", what, " ",
                    split_dim_size, " must be divisible by ", need,
                    v == Variant::bidirectional ? " (2 x the axis size: each block is "
                                                  "split in halves travelling both ways)"
                                                : " (the axis size)",
                    "; pad the operands or use a "
                    "mesh axis that divides it"));
  }
}

}  // namespace

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::naive:
      return "naive";
    case Variant::overlapped:
      return "overlapped";
    case Variant::bidirectional:
      return "bidirectional";
  }
  return "?";
}

Tensor allgather_matmul(Context& ctx, const Tensor& lhs, const Tensor& rhs, const std::string& axis,
                        Variant v) {
  const int64_t n = ctx.axis_size(axis), idx = ctx.axis_index(axis);
  check_blocks("allgather_matmul", lhs, rhs, v, n, lhs.shape()[1],
               "the contracting dimension of lhs");
  if (lhs.shape()[1] != rhs.shape()[0] * n) {
    throw Error(cat("[collective_matmul] allgather_matmul: lhs block ", shape_str(lhs.shape()),
                    " needs k = ", rhs.shape()[0] * n, " columns (rhs block ",
                    shape_str(rhs.shape()), " x ", n, " devices)"));
  }
  if (v == Variant::naive) return matmul(lhs, ctx.all_gather(rhs, axis, 0, true));
  if (v == Variant::overlapped) {
    const int64_t b = lhs.shape()[1] / n;
    const auto up = shift_perm(n, 1);
    Tensor block = rhs;
    Tensor out = zeros({lhs.shape()[0], rhs.shape()[1]}, promote_types(lhs.dtype(), rhs.dtype()),
                       ctx.device());
    for (int64_t i = 0; i < n; ++i) {
      // Start the next shift before this step's matmul, so the two overlap.
      PendingTensor next;
      if (i + 1 < n) next = ctx.ppermute_start(block, axis, up);
      out = out + matmul(dynamic_slice_in_dim(lhs, mod(idx - i, n) * b, b, 1), block);
      if (i + 1 < n) block = next.wait();
    }
    return out;
  }
  // Bidirectional: rhs block halves travel up and down; lhs blocks of width b = k / (2N).
  const int64_t b = lhs.shape()[1] / n / 2;
  const auto up = shift_perm(n, 1), down = shift_perm(n, -1);
  auto halves = split(rhs, 2, 0);
  Tensor lo = halves[0], hi = halves[1];
  Tensor out = zeros({lhs.shape()[0], rhs.shape()[1]}, promote_types(lhs.dtype(), rhs.dtype()),
                     ctx.device());
  for (int64_t i = 0; i < n; ++i) {
    PendingTensor next_lo, next_hi;
    if (i + 1 < n) {
      next_lo = ctx.ppermute_start(lo, axis, up);
      next_hi = ctx.ppermute_start(hi, axis, down);
    }
    out = out + matmul(dynamic_slice_in_dim(lhs, (2 * mod(idx - i, n)) * b, b, 1), lo);
    out = out + matmul(dynamic_slice_in_dim(lhs, (2 * mod(idx + i, n) + 1) * b, b, 1), hi);
    if (i + 1 < n) {
      lo = next_lo.wait();
      hi = next_hi.wait();
    }
  }
  return out;
}

Tensor matmul_reduce_scatter(Context& ctx, const Tensor& lhs, const Tensor& rhs,
                             const std::string& axis, Variant v) {
  const int64_t n = ctx.axis_size(axis), idx = ctx.axis_index(axis);
  check_blocks("matmul_reduce_scatter", lhs, rhs, v, n, lhs.shape()[0], "the number of lhs rows");
  if (lhs.shape()[1] != rhs.shape()[0]) {
    throw Error(cat("[collective_matmul] matmul_reduce_scatter: lhs block ", shape_str(lhs.shape()),
                    " and rhs block ", shape_str(rhs.shape()), " do not contract (", lhs.shape()[1],
                    " != ", rhs.shape()[0], ")"));
  }
  if (v == Variant::naive) {
    if (lhs.shape()[0] % n != 0) {
      throw Error(cat("[collective_matmul] matmul_reduce_scatter (naive): the number of lhs rows ",
                      lhs.shape()[0], " must be divisible by ", n, " (the axis size)"));
    }
    return ctx.psum_scatter(matmul(lhs, rhs), axis, 0, true);
  }
  if (v == Variant::overlapped) {
    const int64_t b = lhs.shape()[0] / n;
    const auto down = shift_perm(n, -1);
    Tensor acc = matmul(dynamic_slice_in_dim(lhs, mod(idx + 1, n) * b, b, 0), rhs);
    for (int64_t i = 1; i < n; ++i) {
      PendingTensor moved = ctx.ppermute_start(acc, axis, down);  // overlaps the next local matmul
      Tensor local = matmul(dynamic_slice_in_dim(lhs, mod(idx + i + 1, n) * b, b, 0), rhs);
      acc = moved.wait() + local;
    }
    return acc;
  }
  const int64_t b = lhs.shape()[0] / n / 2;
  const auto up = shift_perm(n, 1), down = shift_perm(n, -1);
  Tensor lo = matmul(dynamic_slice_in_dim(lhs, (2 * mod(idx - 1, n)) * b, b, 0), rhs);
  Tensor hi = matmul(dynamic_slice_in_dim(lhs, (2 * mod(idx + 1, n) + 1) * b, b, 0), rhs);
  for (int64_t i = 1; i < n; ++i) {
    PendingTensor mlo = ctx.ppermute_start(lo, axis, up);
    PendingTensor mhi = ctx.ppermute_start(hi, axis, down);
    Tensor llo = matmul(dynamic_slice_in_dim(lhs, (2 * mod(idx - i - 1, n)) * b, b, 0), rhs);
    Tensor lhi = matmul(dynamic_slice_in_dim(lhs, (2 * mod(idx + i + 1, n) + 1) * b, b, 0), rhs);
    lo = mlo.wait() + llo;
    hi = mhi.wait() + lhi;
  }
  return concatenate({lo, hi}, 0);
}

Array allgather_matmul(const Array& lhs, const Array& rhs, const Mesh& mesh,
                       const std::string& axis, Variant v) {
  return shard_map([&](Context& ctx, const Tensor& l,
                       const Tensor& r) { return allgather_matmul(ctx, l, r, axis, v); },
                   mesh, {P(axis, None), P(axis, None)}, P(axis, None))(lhs, rhs);
}

Array matmul_reduce_scatter(const Array& lhs, const Array& rhs, const Mesh& mesh,
                            const std::string& axis, Variant v) {
  return shard_map([&](Context& ctx, const Tensor& l,
                       const Tensor& r) { return matmul_reduce_scatter(ctx, l, r, axis, v); },
                   mesh, {P(None, axis), P(axis, None)}, P(axis, None))(lhs, rhs);
}

}  // namespace meshrt::collective_matmul
