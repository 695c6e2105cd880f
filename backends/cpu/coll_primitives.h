// backends/cpu/coll_primitives.h: the cpu platform's collective primitives on host memory
// (memcpy and the fold loops); CpuBackend's coll_* overrides are these, and each completes before
// it returns.
//
// The fold order is fixed: ((x_0 op x_1) op x_2) ... in srcs order, the same for every element
// and whichever device computes it, so every device gets bit-identical results. Element semantics
// (integer sums wrap, pmax/pmin compare as XLA's CPU all-reduce) are backends/scalar_ops.h's,
// shared with the cuda fold kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/backend.h"

namespace meshrt::cpu {

// `height` rows of `width` bytes; row r at dst + r*dpitch and src + r*spitch. Inline: a small
// collective's copies are a memcpy each.
inline void copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                      size_t height) {
  if (width == 0 || height == 0) return;
  if (height == 1 || (dpitch == width && spitch == width)) {
    std::memcpy(dst, src, width * height);
    return;
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t r = 0; r < height; ++r) std::memcpy(d + r * dpitch, s + r * spitch, width);
}
// dst[e] = fold(op, srcs[0][e] .. srcs[n-1][e]) for e < len; mean then divides by n in `out`
// (int32 -> float32, int64 -> float64, as pmean); otherwise out == in. dst may alias a source.
void fold(backend::FoldOp op, DType in, DType out, void* dst, const std::vector<const void*>& srcs,
          int64_t len);
// Bytes a collective copy (coll_copy_2d) must move before it streams them: 2 MiB, a core's L2
// here; an all_gather or all_to_all of 16 MiB per device on 8 devices copies 2 MiB pieces into
// outputs that span 128 MiB, which no cache keeps for the next op.
inline constexpr size_t kStreamCopyBytes = size_t{2} << 20;
// copy_rows with non-temporal stores for the whole 64-byte lines of every destination row (no
// read for ownership of them); the same bytes. Returns false, having done nothing, where this
// build or CPU has no AVX2.
bool copy_rows_streaming(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height);
// Bytes a fold_to call must write, over all its outputs, before it streams them: 4 MiB, twice a
// core's L2 here, and a large psum's slice (64 MiB per device over 8 devices: 64 MiB per call)
// is far beyond it. Below it the outputs are written through the cache, where the next op reads
// them.
inline constexpr int64_t kStreamStoreBytes = int64_t{4} << 20;
// One fold written to every one of `dsts` (a direct psum's slice into every member's output; an
// output may alias a source), the same bits as fold() in each. A call that writes at least
// kStreamStoreBytes with `stream_stores` (MESHRT_CPU_STREAM_STORES) takes fold_to_streaming
// where it can; otherwise tiles of the fold go into dsts[0] and are copied from the cache to
// the others.
void fold_to(backend::FoldOp op, DType in, DType out, const std::vector<void*>& dsts,
             const std::vector<const void*>& srcs, int64_t len, bool stream_stores);
// fold_to line by line with non-temporal stores: every input read once, every output written
// once, without its lines read first. Returns false, having done nothing, where it cannot: no
// AVX2 on this CPU or build, a bool, in != out (an integer pmean), or outputs whose addresses
// differ modulo 64 bytes. bfloat16 and float16 give fold()'s bits: widened, folded in float32,
// rounded once.
bool fold_to_streaming(backend::FoldOp op, DType in, DType out, const std::vector<void*>& dsts,
                       const std::vector<const void*>& srcs, int64_t len);
// `rows` rows of fold(op) (sum, max, min; in = out = dtype): row r of dst at r*dpitch elements,
// of every source at r*spitch.
void fold_rows(backend::FoldOp op, DType dtype, void* dst, int64_t dpitch,
               const std::vector<const void*>& srcs, int64_t spitch, int64_t len, int64_t rows);
// The code paths of the 16-bit (bf16/f16) folds: `portable` runs on any CPU; `avx2` is the same
// code for 256-bit vectors, which fold() takes when the CPU has AVX2. Both give core/half.h's bits.
enum class HalfFoldPath { portable, avx2 };
// The path fold() takes for bf16/f16 on this CPU.
HalfFoldPath half_fold_path();
// Whether this build and CPU can run `path`.
bool half_fold_available(HalfFoldPath path);
// fold() of bf16 or f16 (`dtype`, in = out) through `path`, for tests that compare the paths;
// throws when `path` is not available.
void fold_half_with(HalfFoldPath path, backend::FoldOp op, DType dtype, void* dst,
                    const std::vector<const void*>& srcs, int64_t len);
// dst = sum / divisor in `out` (pmean's last step after a sum in the input dtype).
void mean_from_sum(DType in, DType out, void* dst, const void* sum, int64_t len, int64_t divisor);

}  // namespace meshrt::cpu
