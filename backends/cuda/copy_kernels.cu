// backends/cuda/copy_kernels.cu: the batched copy kernel (copy_kernels.h).
#include <algorithm>
#include <cstdint>

#include "backends/cuda/copy_kernels.h"

namespace meshrt::cuda {
namespace {

struct Desc {
  CopyDesc c;
  int unit;  // bytes moved per access: 16, 8, 4 or 1
};
struct BatchArgs {
  int n;
  Desc d[kMaxBatchCopies];
};
static_assert(sizeof(BatchArgs) < 4096, "kernel parameters stay under 4 KiB");

constexpr int kThreads = 256;

template <class T>
__device__ void copy_one(const CopyDesc& c) {
  const int64_t w = c.width / static_cast<int64_t>(sizeof(T));
  const int64_t total = w * c.height;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c.height == 1 || (c.dpitch == c.width && c.spitch == c.width)) {  // one contiguous run
    T* d = reinterpret_cast<T*>(c.dst);
    const T* s = reinterpret_cast<const T*>(c.src);
    for (; i < total; i += stride) d[i] = s[i];
    return;
  }
  if (total <= INT32_MAX) {  // 32-bit division: several times cheaper than 64-bit
    const auto w32 = static_cast<uint32_t>(w);
    for (; i < total; i += stride) {
      const uint32_t r = static_cast<uint32_t>(i) / w32;
      const uint32_t col = static_cast<uint32_t>(i) - r * w32;
      reinterpret_cast<T*>(c.dst + static_cast<int64_t>(r) * c.dpitch)[col] =
          reinterpret_cast<const T*>(c.src + static_cast<int64_t>(r) * c.spitch)[col];
    }
    return;
  }
  for (; i < total; i += stride) {
    const int64_t r = i / w, col = i - r * w;
    reinterpret_cast<T*>(c.dst + r * c.dpitch)[col] =
        reinterpret_cast<const T*>(c.src + r * c.spitch)[col];
  }
}

// blockIdx.y picks the copy; the x blocks stride over its elements.
__global__ void copy_batch_kernel(const BatchArgs a) {
  const Desc& d = a.d[blockIdx.y];
  switch (d.unit) {
    case 16:
      copy_one<uint4>(d.c);
      break;
    case 8:
      copy_one<uint2>(d.c);
      break;
    case 4:
      copy_one<uint32_t>(d.c);
      break;
    default:
      copy_one<unsigned char>(d.c);
      break;
  }
}

int unit_of(const CopyDesc& c) {
  const auto bits = reinterpret_cast<uintptr_t>(c.dst) | reinterpret_cast<uintptr_t>(c.src) |
                    static_cast<uintptr_t>(c.width) |
                    (c.height > 1 ? static_cast<uintptr_t>(c.dpitch | c.spitch) : 0);
  for (int u : {16, 8, 4}) {
    if ((bits & static_cast<uintptr_t>(u - 1)) == 0) return u;
  }
  return 1;
}

}  // namespace

cudaError_t launch_copy_batch(cudaStream_t s, const CopyDesc* copies, int n) {
  int i = 0;
  while (i < n) {
    BatchArgs a{};
    int64_t most = 0;
    for (; i < n && a.n < kMaxBatchCopies; ++i) {
      const CopyDesc& c = copies[i];
      if (c.width <= 0 || c.height <= 0) continue;
      Desc& d = a.d[a.n++];
      d.c = c;
      d.unit = unit_of(c);
      most = std::max(most, c.width / d.unit * c.height);
    }
    if (a.n == 0) continue;
    // Enough blocks for about 8 accesses per thread on the largest copy, at most 2048 per copy.
    const int64_t want = (most + kThreads * 8 - 1) / (kThreads * 8);
    const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>(want, 1, 2048)),
                    static_cast<unsigned>(a.n));
    copy_batch_kernel<<<grid, kThreads, 0, s>>>(a);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace meshrt::cuda
