#include "backends/cpu/kernels.h"

#include <cblas.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>

#include "backends/cpu/coll_primitives.h"
#include "backends/scalar_ops.h"
#include "core/error.h"
#include "core/strided.h"
#include "core/strings.h"
#include "core/threads/executor.h"

namespace meshrt::cpu {

namespace {

using backend::BinaryOp;
using backend::ReduceOp;
using backend::Strided;
using backend::UnaryOp;

constexpr int64_t kParallelGrain = int64_t{1} << 16;  // elements per task; smaller runs stay serial

// Debian's oneTBB is prebuilt without ThreadSanitizer instrumentation: its task hand-off
// synchronises through atomics TSan cannot see, so every parallel_for would be reported as a race.
// Under TSan the kernels therefore run their ranges serially (the kernels themselves stay checked).
#if defined(__SANITIZE_THREAD__)
constexpr bool kUseTbb = false;
#else
constexpr bool kUseTbb = true;
#endif

tbb::task_arena& arena() {
  static tbb::task_arena* a = new tbb::task_arena(core::process_cores());
  return *a;
}

// Runs fn(begin, end) over [0, n), in parallel chunks when n is large.
template <class F>
void parallel_ranges(int64_t n, F&& fn) {
  if (!kUseTbb || n <= kParallelGrain) {
    fn(int64_t{0}, n);
    return;
  }
  arena().execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kParallelGrain),
                      [&](const tbb::blocked_range<int64_t>& r) { fn(r.begin(), r.end()); });
  });
}

// Runs fn(begin, end) over items [0, n) of `per_item` elements each, in parallel chunks of about
// kParallelGrain elements when there are more than that in all.
template <class F>
void parallel_items(int64_t n, int64_t per_item, F&& fn) {
  if (!kUseTbb || n * per_item <= kParallelGrain || n < 2) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, per_item));
  arena().execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                      [&](const tbb::blocked_range<int64_t>& r) { fn(r.begin(), r.end()); });
  });
}

template <class F>
void with_type(DType t, F&& f) {
  backend::scalar::visit_any_dtype(t, std::forward<F>(f));
}

// Walks output elements [b, e) of `shape` (row-major): fn(out_index, len, offsets) per run along
// the last dimension, where offsets[i] is input i's element offset at out_index and input i
// advances by its last stride along the run.
template <size_t N, class F>
void walk(const std::vector<int64_t>& shape,
          const std::array<const std::vector<int64_t>*, N>& strides, int64_t b, int64_t e, F&& fn) {
  const size_t rank = shape.size();
  if (rank == 0) {
    std::array<int64_t, N> off{};
    if (b < e) fn(int64_t{0}, int64_t{1}, off);
    return;
  }
  const int64_t inner = shape[rank - 1];
  // Every input dense (row-major over the dims larger than 1) or one broadcast value: the range
  // is one run (runs then advance by 1 or 0, which is each input's last stride since inner > 1).
  if (rank > 1 && inner > 1) {
    std::array<int64_t, N> off{};
    bool one_run = true;
    for (size_t i = 0; i < N && one_run; ++i) {
      const std::vector<int64_t>& st = *strides[i];
      bool dense = true, zero = true;
      int64_t expect = 1;
      for (size_t d = rank; d-- > 0;) {
        if (shape[d] == 1) continue;
        dense = dense && st[d] == expect;
        zero = zero && st[d] == 0;
        expect *= shape[d];
      }
      one_run = dense || zero;
      off[i] = dense ? b : 0;
    }
    if (one_run) {
      if (b < e) fn(b, e - b, off);
      return;
    }
  }
  // The index lives on the stack for the usual ranks: a small kernel then allocates nothing.
  constexpr size_t kRank = 8;
  std::array<int64_t, kRank> idx_small{};
  std::vector<int64_t> idx_big(rank > kRank ? rank : 0);
  int64_t* idx = rank > kRank ? idx_big.data() : idx_small.data();
  int64_t rem = b;
  for (size_t d = rank; d-- > 0;) {
    idx[d] = rem % shape[d];
    rem /= shape[d];
  }
  int64_t pos = b;
  while (pos < e) {
    std::array<int64_t, N> off{};
    for (size_t i = 0; i < N; ++i) {
      for (size_t d = 0; d < rank; ++d) off[i] += idx[d] * (*strides[i])[d];
    }
    const int64_t len = std::min(inner - idx[rank - 1], e - pos);
    fn(pos, len, off);
    pos += len;
    idx[rank - 1] += len;
    for (size_t d = rank - 1; d > 0 && idx[d] == shape[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

using backend::scalar::max_nan;
using backend::scalar::min_nan;
using backend::scalar::wrap_add;
using backend::scalar::wrap_mul;
using backend::scalar::wrap_sub;
static_assert(static_cast<int>(UnaryOp::neg) == backend::scalar::kNeg &&
              static_cast<int>(UnaryOp::relu) == backend::scalar::kRelu);

// The dense loops below on CPUs with AVX2: the same element function inlined into a loop the
// compiler vectorises 32 bytes wide instead of the portable build's 16 (SSE2). IEEE arithmetic,
// comparisons, selects and conversions give the same bits at either width, and a call the
// compiler cannot vectorise (exp, log, ...) stays a call per element.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MESHRT_CPU_WIDE_LOOPS 1
bool have_avx2() {
  static const bool v = __builtin_cpu_supports("avx2");
  return v;
}

template <class I, class O, class F>
__attribute__((target("avx2"))) void run1_avx2(const I* x, O* y, int64_t n, F f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

// Mode: 0 both dense, 1 b broadcast (b[0]), 2 a broadcast (a[0]).
template <int Mode, class I, class O, class F>
__attribute__((target("avx2"))) void run2_avx2(const I* a, const I* b, O* y, int64_t n, F f) {
  if constexpr (Mode == 0) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
  } else if constexpr (Mode == 1) {
    const I bv = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], bv);
  } else {
    const I av = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(av, b[i]);
  }
}

#endif

template <class I, class O, class F>
void run1(const I* x, int64_t sx, O* y, int64_t n, F f) {
#if MESHRT_CPU_WIDE_LOOPS
  if (sx == 1 && have_avx2()) return run1_avx2(x, y, n, f);
#endif
  if (sx == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i * sx]);
  }
}

template <class I, class O, class F>
void run2(const I* a, int64_t sa, const I* b, int64_t sb, O* y, int64_t n, F f) {
#if MESHRT_CPU_WIDE_LOOPS
  if (have_avx2() && sa == 1 && (sb == 1 || sb == 0)) {
    return sb == 1 ? run2_avx2<0>(a, b, y, n, f) : run2_avx2<1>(a, b, y, n, f);
  }
  if (have_avx2() && sa == 0 && sb == 1) return run2_avx2<2>(a, b, y, n, f);
#endif
  if (sa == 1 && sb == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const I bv = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const I av = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i * sa], b[i * sb]);
  }
}

// y = op(x) along one run, the op fixed at compile time (the switch in scalar::unary folds away,
// so relu, neg and the rest vectorise).
template <int Code, class T>
void run_unary(const T* x, int64_t sx, T* y, int64_t n) {
  run1(x, sx, y, n, [](T v) -> T { return backend::scalar::unary(Code, v); });
}

template <class T>
void run_unary(UnaryOp op, const T* x, int64_t sx, T* y, int64_t n) {
  namespace s = backend::scalar;
  switch (static_cast<int>(op)) {
    case s::kNeg:
      return run_unary<s::kNeg>(x, sx, y, n);
    case s::kExp:
      return run_unary<s::kExp>(x, sx, y, n);
    case s::kLog:
      return run_unary<s::kLog>(x, sx, y, n);
    case s::kSin:
      return run_unary<s::kSin>(x, sx, y, n);
    case s::kCos:
      return run_unary<s::kCos>(x, sx, y, n);
    case s::kTanh:
      return run_unary<s::kTanh>(x, sx, y, n);
    case s::kSqrt:
      return run_unary<s::kSqrt>(x, sx, y, n);
    case s::kRelu:
      return run_unary<s::kRelu>(x, sx, y, n);
    case static_cast<int>(UnaryOp::copy):
      return run_unary<static_cast<int>(UnaryOp::copy)>(x, sx, y, n);
    default:
      throw Error(
          detail::cat("[cpu] unary op ", static_cast<int>(op),
                      " has no cpu kernel; add it to run_unary and backend::scalar::unary"));
  }
}

// c ? a : b on the bits, without a branch: the form the compiler vectorises. The condition is a
// bool's byte as stored, so any nonzero byte selects a.
template <class T>
inline T pick(uint8_t c, T a, T b) {
  using U =
      std::conditional_t<sizeof(T) == 8, uint64_t,
                         std::conditional_t<sizeof(T) == 4, uint32_t,
                                            std::conditional_t<sizeof(T) == 2, uint16_t, uint8_t>>>;
  const U m = static_cast<U>(U{0} - static_cast<U>(c != 0));
  return std::bit_cast<T>(static_cast<U>((std::bit_cast<U>(a) & m) | (std::bit_cast<U>(b) & ~m)));
}

// A copy whose last two output dims read the input transposed (x's stride along the last dim is
// not 1, along the one before it is 1): y[..., i, j] = x[... + i + j * sc]. Read naively, every
// element is a cache miss; here both sides move in 32 x 32 tiles, parallel over tile rows.
constexpr int64_t kTile = 32;

bool is_transposed_copy(const std::vector<int64_t>& shape, const Strided& x) {
  const size_t r = shape.size();
  return r >= 2 && x.strides[r - 2] == 1 && x.strides[r - 1] > 1 && shape[r - 1] >= kTile &&
         shape[r - 2] >= kTile;
}

template <class T>
void transposed_copy(const std::vector<int64_t>& shape, const Strided& x, T* y) {
  const size_t r = shape.size();
  const int64_t rows = shape[r - 2], cols = shape[r - 1], sc = x.strides[r - 1];
  int64_t outer = 1;
  for (size_t d = 0; d + 2 < r; ++d) outer *= shape[d];
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const T* xp = static_cast<const T*>(x.data);
  // Work items: (outer index, tile row); parallel when the copy is large.
  parallel_items(outer * row_tiles, kTile * cols, [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t o = item / row_tiles, i0 = item % row_tiles * kTile;
      // The outer index's input offset (mixed radix over the leading dims).
      int64_t off = 0;
      for (int64_t rem = o, d = static_cast<int64_t>(r) - 3; d >= 0; --d) {
        off += rem % shape[static_cast<size_t>(d)] * x.strides[static_cast<size_t>(d)];
        rem /= shape[static_cast<size_t>(d)];
      }
      const T* xo = xp + off;
      T* yo = y + o * rows * cols;
      const int64_t i1 = std::min(rows, i0 + kTile);
      for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
        const int64_t j1 = std::min(cols, j0 + kTile);
        for (int64_t i = i0; i < i1; ++i) {
          for (int64_t j = j0; j < j1; ++j) yo[i * cols + j] = xo[i + j * sc];
        }
      }
    }
  });
}

}  // namespace

void unary(UnaryOp op, DType in, DType out, const std::vector<int64_t>& shape, const Strided& x,
           void* y) {
  const int64_t n = [&] {
    int64_t c = 1;
    for (int64_t d : shape) c *= d;
    return c;
  }();
  if (n == 0) return;
  if (op == UnaryOp::copy && in == out && is_transposed_copy(shape, x)) {
    with_type(in, [&](auto v) { transposed_copy(shape, x, static_cast<decltype(v)*>(y)); });
    return;
  }
  with_type(in, [&](auto iv) {
    using I = decltype(iv);
    with_type(out, [&](auto ov) {
      using O = decltype(ov);
      const I* xp = static_cast<const I*>(x.data);
      O* yp = static_cast<O*>(y);
      const int64_t sx = shape.empty() ? 0 : x.strides.back();
      parallel_ranges(n, [&](int64_t b, int64_t e) {
        walk<1>(shape, {&x.strides}, b, e,
                [&](int64_t pos, int64_t len, const std::array<int64_t, 1>& off) {
                  if (op == UnaryOp::copy) {
                    run1(xp + off[0], sx, yp + pos, len,
                         [](I v) { return backend::scalar::convert<O>(v); });
                  } else if constexpr (std::is_same_v<I, O>) {
                    run_unary(op, xp + off[0], sx, yp + pos, len);
                  } else {
                    throw Error("[cpu] unary kernel needs equal input and output dtypes");
                  }
                });
      });
    });
  });
}

void binary(BinaryOp op, DType in, DType out, const std::vector<int64_t>& shape, const Strided& a,
            const Strided& b, void* y) {
  const int64_t n = [&] {
    int64_t c = 1;
    for (int64_t d : shape) c *= d;
    return c;
  }();
  if (n == 0) return;
  with_type(in, [&](auto iv) {
    using I = decltype(iv);
    const I* ap = static_cast<const I*>(a.data);
    const I* bp = static_cast<const I*>(b.data);
    const int64_t sa = shape.empty() ? 0 : a.strides.back(),
                  sb = shape.empty() ? 0 : b.strides.back();
    bool b_broadcast = false;
    for (size_t d = 0; d < shape.size(); ++d) b_broadcast |= shape[d] > 1 && b.strides[d] == 0;
    const bool compare = op == BinaryOp::eq || op == BinaryOp::ne || op == BinaryOp::lt ||
                         op == BinaryOp::le || op == BinaryOp::gt || op == BinaryOp::ge;
    if ((compare && out != DType::bool_) || (!compare && out != in)) {
      throw Error("[cpu] binary kernel: bad output dtype");
    }
    parallel_ranges(n, [&](int64_t lo, int64_t hi) {
      walk<2>(shape, {&a.strides, &b.strides}, lo, hi,
              [&](int64_t pos, int64_t len, const std::array<int64_t, 2>& off) {
                const I* pa = ap + off[0];
                const I* pb = bp + off[1];
                if (compare) {
                  bool* yp = static_cast<bool*>(y) + pos;
                  switch (op) {
                    case BinaryOp::eq:
                      return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return u == v; });
                    case BinaryOp::ne:
                      return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return u != v; });
                    case BinaryOp::lt:
                      return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return u < v; });
                    case BinaryOp::le:
                      return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return u <= v; });
                    case BinaryOp::gt:
                      return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return u > v; });
                    default:
                      return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return u >= v; });
                  }
                }
                I* yp = static_cast<I*>(y) + pos;
                switch (op) {
                  case BinaryOp::add:
                    return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return wrap_add(u, v); });
                  case BinaryOp::sub:
                    return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return wrap_sub(u, v); });
                  case BinaryOp::mul:
                    return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return wrap_mul(u, v); });
                  case BinaryOp::div:
                    if constexpr (std::is_same_v<I, float16>) {
                      // XLA's cpu divides float16 by a broadcast divisor as a product with its
                      // reciprocal rounded to float16 (checked against JAX 0.10.2).
                      if (b_broadcast) {
                        return run2(pa, sa, pb, sb, yp, len,
                                    [](I u, I v) { return u * I(1.0f / static_cast<float>(v)); });
                      }
                    }
                    if constexpr (backend::scalar::is_float_v<I>) {
                      return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return u / v; });
                    } else {
                      throw Error(
                          "[cpu] integer division reached the kernel; the runtime divides in "
                          "floating point");
                    }
                  case BinaryOp::max:
                    return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return max_nan(u, v); });
                  default:
                    return run2(pa, sa, pb, sb, yp, len, [](I u, I v) { return min_nan(u, v); });
                }
              });
    });
  });
}

void select(DType dtype, const std::vector<int64_t>& shape, const Strided& cond, const Strided& a,
            const Strided& b, void* y) {
  const int64_t n = [&] {
    int64_t c = 1;
    for (int64_t d : shape) c *= d;
    return c;
  }();
  if (n == 0) return;
  with_type(dtype, [&](auto tv) {
    using T = decltype(tv);
    // The condition's bytes as stored: a bool byte other than 0 or 1 (memory filled from
    // outside) still picks a, as the scalar path's test does.
    const auto* cp = static_cast<const uint8_t*>(cond.data);
    const T* ap = static_cast<const T*>(a.data);
    const T* bp = static_cast<const T*>(b.data);
    T* yp = static_cast<T*>(y);
    const int64_t sc = shape.empty() ? 0 : cond.strides.back(),
                  sa = shape.empty() ? 0 : a.strides.back(),
                  sb = shape.empty() ? 0 : b.strides.back();
    parallel_ranges(n, [&](int64_t lo, int64_t hi) {
      walk<3>(shape, {&cond.strides, &a.strides, &b.strides}, lo, hi,
              [&](int64_t pos, int64_t len, const std::array<int64_t, 3>& off) {
                const uint8_t* c = cp + off[0];
                const T* pa = ap + off[1];
                const T* pb = bp + off[2];
                T* out = yp + pos;
                // The usual forms (dense operands, or a broadcast scalar branch: where(m, g, 0))
                // as branch-free loops the compiler vectorises (a random mask would mispredict
                // every other branch).
                if (sc == 1 && sa == 1 && sb == 1) {
#pragma omp simd
                  for (int64_t i = 0; i < len; ++i) {
                    out[i] = pick(c[i], pa[i], pb[i]);
                  }
                } else if (sc == 1 && sa == 1 && sb == 0) {
                  const T bv = pb[0];
#pragma omp simd
                  for (int64_t i = 0; i < len; ++i) {
                    out[i] = pick(c[i], pa[i], bv);
                  }
                } else if (sc == 1 && sa == 0 && sb == 1) {
                  const T av = pa[0];
#pragma omp simd
                  for (int64_t i = 0; i < len; ++i) {
                    out[i] = pick(c[i], av, pb[i]);
                  }
                } else {
                  for (int64_t i = 0; i < len; ++i) {
                    out[i] = c[i * sc] != 0 ? pa[i * sa] : pb[i * sb];
                  }
                }
              });
    });
  });
}

void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
             size_t height) {
  constexpr size_t kGrainBytes = size_t{1} << 20;
  if (width * height <= kGrainBytes) {
    copy_rows(dst, dpitch, src, spitch, width, height);  // the collectives' serial copy
    return;
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (height == 1 || (dpitch == width && spitch == width)) {
    // One contiguous run: chunks of it (parallel_items counts elements; here bytes / 16).
    const int64_t n = static_cast<int64_t>(width * height);
    parallel_items((n + static_cast<int64_t>(kGrainBytes) - 1) / static_cast<int64_t>(kGrainBytes),
                   kParallelGrain, [&](int64_t lo, int64_t hi) {
                     const int64_t b = lo * static_cast<int64_t>(kGrainBytes);
                     const int64_t e = std::min(n, hi * static_cast<int64_t>(kGrainBytes));
                     std::memcpy(d + b, s + b, static_cast<size_t>(e - b));
                   });
    return;
  }
  // Rows: about kGrainBytes of them per task.
  const int64_t rows = static_cast<int64_t>(height);
  const int64_t per_row =
      static_cast<int64_t>(width) * kParallelGrain / static_cast<int64_t>(kGrainBytes);
  parallel_items(rows, std::max<int64_t>(per_row, 1), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      std::memcpy(d + static_cast<size_t>(r) * dpitch, s + static_cast<size_t>(r) * spitch, width);
    }
  });
}

void copy_2d_batch(const std::vector<backend::DeviceCopy>& copies) {
  // Pieces of about kPieceBytes (rows of a pitched copy, a range of a contiguous one), split
  // across the arena: an all_to_all's 64 copies of 512 KiB each, every one below copy_2d's grain,
  // otherwise run one after another on the caller's thread.
  constexpr size_t kPieceBytes = size_t{256} << 10;
  size_t total = 0;
  for (const backend::DeviceCopy& c : copies) total += c.width * c.height;
  if (total <= kPieceBytes * 4) {
    for (const backend::DeviceCopy& c : copies)
      copy_rows(c.dst, c.dpitch, c.src, c.spitch, c.width, c.height);
    return;
  }
  struct Piece {
    const backend::DeviceCopy* c;
    size_t first, count;  // rows, or bytes of a contiguous copy
  };
  std::vector<Piece> pieces;
  for (const backend::DeviceCopy& c : copies) {
    if (c.width == 0 || c.height == 0) continue;
    if (c.height == 1 || (c.dpitch == c.width && c.spitch == c.width)) {
      const size_t n = c.width * c.height;
      for (size_t b = 0; b < n; b += kPieceBytes)
        pieces.push_back({&c, b, std::min(kPieceBytes, n - b)});
    } else {
      const size_t per = std::max<size_t>(1, kPieceBytes / c.width);
      for (size_t r = 0; r < c.height; r += per)
        pieces.push_back({&c, r, std::min(per, c.height - r)});
    }
  }
  parallel_items(static_cast<int64_t>(pieces.size()), kParallelGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const Piece& p = pieces[static_cast<size_t>(i)];
      const backend::DeviceCopy& c = *p.c;
      auto* d = static_cast<char*>(c.dst);
      const auto* s = static_cast<const char*>(c.src);
      if (c.height == 1 || (c.dpitch == c.width && c.spitch == c.width)) {
        std::memcpy(d + p.first, s + p.first, p.count);
      } else {
        copy_rows(d + p.first * c.dpitch, c.dpitch, s + p.first * c.spitch, c.spitch, c.width,
                  p.count);
      }
    }
  });
}

namespace {

constexpr size_t kChainMaxOps = 64;
// Elements per tile of a chain: its intermediates stay in the core's cache.
constexpr int64_t kChainTile = 4096;

// Where each op's result but the last lives in a tile: a slot of kChainTile 8-byte elements,
// reused once no later op reads it (an op never writes a slot it reads). An earlier output keeps
// its slot to the tile's end, when it is written out. Returns the slot count.
int plan_slots(const backend::ElementwiseChain& chain, std::array<int, kChainMaxOps>& slot) {
  const size_t nops = chain.ops.size();
  // (Arrays left uninitialised past what a chain uses: a small chain's call is mostly this.)
  std::array<size_t, kChainMaxOps> last_read;
  std::fill_n(last_read.begin(), nops, size_t{0});
  for (size_t i = 0; i < nops; ++i) {
    const backend::ChainOp& o = chain.ops[i];
    for (int j = 0; j < o.reads(); ++j) {
      if (o.src[j] >= chain.inputs) last_read[static_cast<size_t>(o.src[j] - chain.inputs)] = i;
    }
  }
  for (size_t k = 0; k + 1 < chain.output_count(); ++k) {
    last_read[static_cast<size_t>(chain.output(k) - chain.inputs)] = nops;
  }
  std::array<int, kChainMaxOps> free_slots;
  int slots = 0, nfree = 0;
  for (size_t i = 0; i + 1 < nops; ++i) {
    if (chain.ops[i].kind == backend::ChainOp::Kind::constant) {  // read from ChainScratch::cst
      slot[i] = -1;
      continue;
    }
    slot[i] = nfree > 0 ? free_slots[static_cast<size_t>(--nfree)] : slots++;
    // Results op i was the last to read: their slots are free from op i + 1 on.
    for (size_t k = 0; k < i; ++k) {
      if (last_read[k] == i && slot[k] >= 0) free_slots[static_cast<size_t>(nfree++)] = slot[k];
    }
  }
  return slots;
}

// A thread's scratch for chains: the tiles' slots, and Strided views reused from call to call,
// so a chain allocates nothing once a thread has run one as large.
struct ChainScratch {
  std::vector<uint64_t> mem;
  std::vector<Strided> in, temp;
  std::vector<int64_t> sub;
  // Per op: a constant's value (fill's bits) and its broadcast view over the tile.
  std::array<uint64_t, kChainMaxOps> cval{};
  std::vector<Strided> cst;
};

ChainScratch& chain_scratch() {
  thread_local ChainScratch s;
  return s;
}

// Runs the chain's ops over one tile of shape `sub`: inputs `in`, intermediates in `temp` (by
// slot), the last op into `out[last]`; then copies the earlier outputs' slots to `out[k]` (dense
// tiles of `count` elements), after every read of the inputs.
void run_chain_tile(const backend::ElementwiseChain& chain,
                    const std::array<int, kChainMaxOps>& slot, const std::vector<int64_t>& sub,
                    std::span<const Strided> in, const std::vector<Strided>& temp,
                    std::span<void* const> out, int64_t count) {
  using Kind = backend::ChainOp::Kind;
  const ChainScratch& s = chain_scratch();
  auto value = [&](int v) -> const Strided& {
    if (v < chain.inputs) return in[static_cast<size_t>(v)];
    const auto i = static_cast<size_t>(v - chain.inputs);
    return slot[i] < 0 ? s.cst[i] : temp[static_cast<size_t>(slot[i])];
  };
  const size_t nops = chain.ops.size();
  for (size_t i = 0; i < nops; ++i) {
    const backend::ChainOp& op = chain.ops[i];
    if (op.kind == Kind::constant) continue;
    void* dst =
        i + 1 == nops ? out.back() : const_cast<void*>(temp[static_cast<size_t>(slot[i])].data);
    switch (op.kind) {
      case Kind::unary:
        unary(static_cast<UnaryOp>(op.op), op.in, op.out, sub, value(op.src[0]), dst);
        break;
      case Kind::binary:
        binary(static_cast<BinaryOp>(op.op), op.in, op.out, sub, value(op.src[0]), value(op.src[1]),
               dst);
        break;
      case Kind::select:
        select(op.out, sub, value(op.src[0]), value(op.src[1]), value(op.src[2]), dst);
        break;
      case Kind::constant:
        break;
    }
  }
  for (size_t k = 0; k + 1 < out.size(); ++k) {
    const int v = chain.output(k);
    std::memcpy(out[k], value(v).data,
                static_cast<size_t>(count) * dtype_size(chain.value_dtype(v)));
  }
}

// Points `temp`'s first `slots` views at `s.mem`, dense over `sub`, and the constants' views at
// their values, broadcast over `sub`.
void set_temps(ChainScratch& s, int slots, const std::vector<int64_t>& sub,
               std::span<const size_t> consts) {
  for (size_t i : consts) s.cst[i].strides.assign(sub.size(), 0);
  // Only grows: a shrink and regrow would zero the slots again on every call.
  const size_t words = static_cast<size_t>(slots) * static_cast<size_t>(kChainTile);
  if (s.mem.size() < words) s.mem.resize(words);
  if (s.temp.size() < static_cast<size_t>(slots)) s.temp.resize(static_cast<size_t>(slots));
  for (int k = 0; k < slots; ++k) {
    Strided& t = s.temp[static_cast<size_t>(k)];
    t.data = s.mem.data() + static_cast<size_t>(k) * kChainTile;
    t.strides.resize(sub.size());
    int64_t st = 1;
    for (size_t d = sub.size(); d-- > 0;) {
      t.strides[d] = st;
      st *= sub[d];
    }
  }
}

}  // namespace

bool chain_takes(const backend::ElementwiseChain& chain) {
  if (chain.ops.empty() || chain.ops.size() > kChainMaxOps) return false;
  if (chain.output_count() > backend::ElementwiseChain::kMaxOutputs || !chain.outputs_valid()) {
    return false;
  }
  for (const backend::ChainOp& o : chain.ops) {
    // Float16 divided by a broadcast divisor goes through its reciprocal (binary, above), decided
    // over the whole shape: a tile of one row would see no broadcast and divide.
    if (o.kind == backend::ChainOp::Kind::binary && o.op == static_cast<int>(BinaryOp::div) &&
        o.in == DType::f16) {
      return false;
    }
  }
  return true;
}

void elementwise_chain(const backend::ElementwiseChain& chain, const std::vector<int64_t>& shape,
                       std::span<const Strided> inputs, std::span<void* const> ys) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (!chain_takes(chain)) throw Error("[cpu] elementwise_chain: a chain cpu does not fuse");
  if (ys.size() != chain.output_count() || inputs.size() != chain.input_dtypes.size()) {
    throw Error("[cpu] elementwise_chain: the destinations or inputs do not match the chain");
  }
  if (n == 0) return;
  std::array<int, kChainMaxOps> slot;  // plan_slots sets every op's but the last's
  const int slots = plan_slots(chain, slot);
  // The constants (by op) and their values as fill stores them, copied into each thread's
  // scratch (prepare).
  std::array<size_t, kChainMaxOps> const_ops;
  std::array<uint64_t, kChainMaxOps> cval;
  size_t nconst = 0;
  for (size_t i = 0; i < chain.ops.size(); ++i) {
    const backend::ChainOp& o = chain.ops[i];
    if (o.kind != backend::ChainOp::Kind::constant) continue;
    fill(o.out, 1, o.value, false, &cval[i]);
    const_ops[nconst++] = i;
  }
  const std::span<const size_t> consts(const_ops.data(), nconst);
  auto prepare = [&](ChainScratch& s) {
    if (nconst == 0) return;
    if (s.cst.size() < chain.ops.size()) s.cst.resize(chain.ops.size());
    for (size_t i : consts) {
      s.cval[i] = cval[i];
      s.cst[i].data = &s.cval[i];
    }
  };
  if (n <= kChainTile) {  // one tile: the inputs as they are, nothing to split
    ChainScratch& s = chain_scratch();
    prepare(s);
    set_temps(s, slots, shape, consts);
    run_chain_tile(chain, slot, shape, inputs, s.temp, ys, n);
    return;
  }
  // A tile is a box of the output: one index of every dimension before `s`, a run of `chunk`
  // indices along `s`, all of the dimensions after it (`inner` elements per index of s), at most
  // kChainTile elements. Each op runs over the tile as its own kernel (the same function, so the
  // same bits per element).
  const size_t rank = shape.size();
  size_t first = rank;  // dimensions [first, rank) fit in one tile (first > 0: n > kChainTile)
  int64_t inner = 1;
  while (first > 0 && inner * shape[first - 1] <= kChainTile) inner *= shape[--first];
  const size_t sd = first - 1;
  const int64_t along = shape[sd];
  // Tiles of even size along sd (4097 elements: two of 2049 and 2048, not 4096 and 1).
  const int64_t most = std::max<int64_t>(1, kChainTile / inner);
  const int64_t chunks = (along + most - 1) / most;
  const int64_t chunk = (along + chunks - 1) / chunks;
  int64_t outer = 1;
  for (size_t d = 0; d < sd; ++d) outer *= shape[d];
  parallel_items(outer * chunks, chunk * inner, [&](int64_t lo, int64_t hi) {
    ChainScratch& s = chain_scratch();
    prepare(s);
    if (s.in.size() < inputs.size()) s.in.resize(inputs.size());
    std::array<void*, backend::ElementwiseChain::kMaxOutputs> out{};
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t o = item / chunks, c0 = (item % chunks) * chunk;
      const int64_t len = std::min(chunk, along - c0);
      // The tile's shape: (len, the dims after sd).
      s.sub.assign(1, len);
      s.sub.insert(s.sub.end(), shape.begin() + static_cast<std::ptrdiff_t>(sd) + 1, shape.end());
      for (size_t i = 0; i < inputs.size(); ++i) {
        const std::vector<int64_t>& st = inputs[i].strides;
        int64_t off = c0 * st[sd], rem = o;
        for (size_t d = sd; d-- > 0;) {
          off += (rem % shape[d]) * st[d];
          rem /= shape[d];
        }
        s.in[i].strides.assign(st.begin() + static_cast<std::ptrdiff_t>(sd), st.end());
        s.in[i].data = static_cast<const char*>(inputs[i].data) +
                       off * static_cast<int64_t>(dtype_size(chain.input_dtypes[i]));
      }
      set_temps(s, slots, s.sub, consts);
      // The tile is len * inner consecutive elements of every (dense) output.
      const int64_t at = (o * along + c0) * inner;
      for (size_t k = 0; k < ys.size(); ++k) {
        out[k] = static_cast<char*>(ys[k]) +
                 at * static_cast<int64_t>(dtype_size(chain.value_dtype(chain.output(k))));
      }
      run_chain_tile(chain, slot, s.sub, std::span<const Strided>(s.in.data(), inputs.size()),
                     s.temp, std::span<void* const>(out.data(), ys.size()), len * inner);
    }
  });
}

void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t len, int64_t inner, const void* x,
            void* y) {
  if (is_half(dtype)) {
    // bf16/f16 accumulate in float32 and round once per output (JAX's sums of bf16).
    const int64_t n = outer * len * inner, m = outer * inner;
    std::vector<float> xf(static_cast<size_t>(n));
    unary(UnaryOp::copy, dtype, DType::f32, {n}, {x, {1}}, xf.data());
    if (op == ReduceOp::argmax) return reduce(op, DType::f32, outer, len, inner, xf.data(), y);
    std::vector<float> yf(static_cast<size_t>(m));
    reduce(op, DType::f32, outer, len, inner, xf.data(), yf.data());
    unary(UnaryOp::copy, DType::f32, dtype, {m}, {yf.data(), {1}}, y);
    return;
  }
  with_type(dtype, [&](auto tv) {
    using T = decltype(tv);
    if constexpr (std::is_same_v<T, bool> || is_half_v<T>) {
      throw Error("[cpu] reductions of bool are converted to integers by the runtime first");
    } else {
      const T* xp = static_cast<const T*>(x);
      const int64_t rows = outer * inner;
      auto body = [&](int64_t lo, int64_t hi) {
        // One output row (o, i..i+w) at a time, accumulating over len: vectorises over inner.
        for (int64_t r = lo; r < hi;) {
          const int64_t o = r / std::max<int64_t>(inner, 1), i0 = r % std::max<int64_t>(inner, 1);
          const int64_t w = std::min(inner - i0, hi - r);
          const T* base = xp + o * len * inner + i0;
          if (op == ReduceOp::argmax) {
            int64_t* yp = static_cast<int64_t*>(y) + r;
            for (int64_t i = 0; i < w; ++i) {
              T best = base[i];
              int64_t at = 0;
              for (int64_t l = 1; l < len; ++l) {
                const T v = base[l * inner + i];
                if (backend::scalar::argmax_better(best, v)) {
                  best = v;
                  at = l;
                }
              }
              yp[i] = at;
            }
          } else {
            T* yp = static_cast<T*>(y) + r;
            if (len == 0) {
              for (int64_t i = 0; i < w; ++i) yp[i] = T(0);
            } else {
              for (int64_t i = 0; i < w; ++i) yp[i] = base[i];
              for (int64_t l = 1; l < len; ++l) {
                const T* row = base + l * inner;
                switch (op) {
                  case ReduceOp::sum:
#pragma omp simd
                    for (int64_t i = 0; i < w; ++i) yp[i] = wrap_add(yp[i], row[i]);
                    break;
                  case ReduceOp::max:
                    for (int64_t i = 0; i < w; ++i) yp[i] = max_nan(yp[i], row[i]);
                    break;
                  default:
                    for (int64_t i = 0; i < w; ++i) yp[i] = min_nan(yp[i], row[i]);
                    break;
                }
              }
            }
          }
          r += w;
        }
      };
      if (kUseTbb && rows * std::max<int64_t>(len, 1) > kParallelGrain && rows > 1) {
        arena().execute([&] {
          tbb::parallel_for(
              tbb::blocked_range<int64_t>(
                  0, rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(len, 1))),
              [&](const tbb::blocked_range<int64_t>& r) { body(r.begin(), r.end()); });
        });
      } else {
        body(0, rows);
      }
    }
  });
}

namespace {

// How a product's operands are stored: A (m, k) or, transposed, (k, m); B (k, n) or (n, k).
struct GemmLayout {
  int64_t m, n, k;
  bool ta, tb;
};

// C[m, n] = op(A) @ op(B) (row-major) for rows [r0, r1) and columns [c0, c1), one BLAS call on
// the calling thread; a transposed operand is BLAS's transposed product, not a copy.
template <class T>
void gemm_block(const T* A, const T* B, T* C, const GemmLayout& g, int64_t r0, int64_t r1,
                int64_t c0, int64_t c1) {
  const auto rows = static_cast<int>(r1 - r0), cols = static_cast<int>(c1 - c0);
  const T* a = g.ta ? A + r0 : A + r0 * g.k;  // rows r0.. of op(A)
  const T* b = g.tb ? B + c0 * g.k : B + c0;  // columns c0.. of op(B)
  const auto lda = static_cast<int>(g.ta ? g.m : g.k), ldb = static_cast<int>(g.tb ? g.k : g.n);
  const CBLAS_TRANSPOSE ta = g.ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = g.tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, rows, cols, static_cast<int>(g.k), 1.0f, a, lda, b, ldb,
                0.0f, C + r0 * g.n + c0, static_cast<int>(g.n));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, rows, cols, static_cast<int>(g.k), 1.0, a, lda, b, ldb, 0.0,
                C + r0 * g.n + c0, static_cast<int>(g.n));
  }
}

// Rows [r0, r1) of C, all columns: a narrow product (n <= kNarrowCols) in row blocks of
// kNarrowRows. OpenBLAS runs tall, narrow products below its rate (8 devices at once on 2 cores,
// (8192, 1024) x (1024, 128) with B transposed: 192-200 GFLOP/s in one call, 223-226 in blocks
// of 512 rows with its AVX2 kernels, 342 -> 372 with its AVX-512 ones; (8192, 1024) x (1024, 8):
// 55 -> 81-82 with either); wide products gain nothing or lose (-5% with AVX-512). The blocks
// split rows only, so each element sums the same products; whether BLAS keeps their order for a
// smaller call is its own affair (as for the arena's split, which already depends on load).
constexpr int64_t kNarrowCols = 256, kNarrowRows = 512;
template <class T>
void gemm_rows(const T* A, const T* B, T* C, const GemmLayout& g, int64_t r0, int64_t r1) {
  if (g.n > kNarrowCols) {
    gemm_block(A, B, C, g, r0, r1, 0, g.n);
    return;
  }
  for (int64_t lo = r0; lo < r1; lo += kNarrowRows) {
    gemm_block(A, B, C, g, lo, std::min(r1, lo + kNarrowRows), 0, g.n);
  }
}

// Products this large are split into blocks that run in the shared oneTBB arena, whose threads
// are the process's cores: a device alone gets every core, devices busy at once share them (each
// calling thread runs its own blocks when the others are taken). BLAS itself runs one thread
// per call (configure_blas_threads), so the arena is the only place cores are handed out.
constexpr int64_t kParallelGemmFlops = int64_t{1} << 24;

// Products being computed right now, process-wide: when they already keep every core busy
// (devices multiplying at once), splitting one more would only add scheduling.
std::atomic<int> g_gemms{0};

template <class T>
void blocked_gemm(const T* A, const T* B, T* C, const GemmLayout& g) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const int64_t cores = core::process_cores();
  struct Count {
    Count() { g_gemms.fetch_add(1, std::memory_order_relaxed); }
    ~Count() { g_gemms.fetch_sub(1, std::memory_order_relaxed); }
  } counted;
  if (!kUseTbb || cores == 1 || m * n * k < kParallelGemmFlops ||
      g_gemms.load(std::memory_order_relaxed) >= cores) {
    gemm_rows(A, B, C, g, 0, m);
    return;
  }
  // Rows when there are enough (each block then shares B), else columns.
  const bool by_rows = m >= 8 * cores || m >= n;
  const int64_t extent = by_rows ? m : n;
  const int64_t parts = std::min(extent, 2 * cores);  // two per core: blocks finish unevenly
  arena().execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, parts, 1),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        for (int64_t p = r.begin(); p != r.end(); ++p) {
                          const int64_t lo = extent * p / parts, hi = extent * (p + 1) / parts;
                          if (by_rows)
                            gemm_rows(A, B, C, g, lo, hi);
                          else
                            gemm_block(A, B, C, g, 0, m, lo, hi);
                        }
                      });
  });
}

}  // namespace

void matmul(DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, const void* a,
            const void* b, void* c, bool trans_a, bool trans_b) {
  if (is_half(dtype)) {
    // bf16/f16: operands widened to float32, one sgemm (f32 accumulation), the result rounded once.
    const int64_t na = batch * m * k, nb = batch * k * n, nc = batch * m * n;
    std::vector<float> af(static_cast<size_t>(na)), bf(static_cast<size_t>(nb)),
        cf(static_cast<size_t>(nc));
    unary(UnaryOp::copy, dtype, DType::f32, {na}, {a, {1}}, af.data());
    unary(UnaryOp::copy, dtype, DType::f32, {nb}, {b, {1}}, bf.data());
    matmul(DType::f32, batch, m, n, k, af.data(), bf.data(), cf.data(), trans_a, trans_b);
    unary(UnaryOp::copy, DType::f32, dtype, {nc}, {cf.data(), {1}}, c);
    return;
  }
  with_type(dtype, [&](auto tv) {
    using T = decltype(tv);
    if constexpr (std::is_same_v<T, bool> || is_half_v<T>) {
      throw Error("[cpu] matmul of bool is converted by the runtime first");
    } else {
      const T* ap = static_cast<const T*>(a);
      const T* bp = static_cast<const T*>(b);
      T* cp = static_cast<T*>(c);
      for (int64_t i = 0; i < batch; ++i) {
        const T* A = ap + i * m * k;
        const T* B = bp + i * k * n;
        T* C = cp + i * m * n;
        if (m == 0 || n == 0) continue;
        if (k == 0) {
          std::fill(C, C + m * n, T(0));
          continue;
        }
        if constexpr (std::is_floating_point_v<T>) {
          blocked_gemm(A, B, C, GemmLayout{m, n, k, trans_a, trans_b});
        } else {
          // Integers (no BLAS): i-k-j order, wrapping like XLA.
          std::fill(C, C + m * n, T(0));
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t q = 0; q < k; ++q) {
              const T av = trans_a ? A[q * m + r] : A[r * k + q];
              for (int64_t j = 0; j < n; ++j) {
                const T bv = trans_b ? B[j * k + q] : B[q * n + j];
                C[r * n + j] = wrap_add(C[r * n + j], wrap_mul(av, bv));
              }
            }
          }
        }
      }
    }
  });
}

void fill(DType dtype, int64_t n, double value, bool iota, void* y) {
  with_type(dtype, [&](auto tv) {
    using T = decltype(tv);
    T* yp = static_cast<T*>(y);
    if (iota) {
      for (int64_t i = 0; i < n; ++i) yp[i] = static_cast<T>(i);
    } else {
      const T v = backend::scalar::convert<T>(value);
      std::fill(yp, yp + n, v);
    }
  });
}

void configure_blas_threads() {
  // Large products are split across the arena's threads (blocked_gemm) instead: OpenBLAS's own
  // threads would come on top of busy devices' threads, and it cannot know how many are busy.
  openblas_set_num_threads(1);
}

}  // namespace meshrt::cpu
