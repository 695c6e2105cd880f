// backends/cuda/chain_kernels.cu: an elementwise chain in one kernel (chain_kernels.h).
//
// One interpreter for every chain: the ops arrive in the launch's parameters (__grid_constant__,
// read from constant memory where the whole warp reads the same op, so the switches below are
// warp-uniform). A value is its dtype's bits zero-extended to 64, in a per-thread register file
// in shared memory (slot k of thread t at [k * kChainThreads + t]: a warp's 64-bit accesses are
// conflict-free), indexed at run time without local memory. Inputs are loaded as raw bits; each op
// decodes its operands to their C++ type, applies its single-op kernel's element function
// (elementwise_ops.cuh: scalar_ops.h and core/half.h beneath) and encodes the result, so every
// value is rounded to its dtype exactly where its own kernel would store it. Values cross between
// ops through shared memory and float add/sub/mul are the _rn intrinsics: nothing contracts
// across two ops. A chain of float32 values and float32 ops only (an optimizer's update, an
// activation) takes a register file of floats and a switch on the op alone (f32_step), with the
// same element functions.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "backends/cuda/chain_kernels.h"
#include "backends/cuda/elementwise.cuh"
#include "backends/cuda/elementwise_ops.cuh"
#include "backends/op_codes.h"
#include "backends/scalar_ops.h"

namespace meshrt::cuda {
namespace {

namespace sc = backend::scalar;
using backend::BinaryOp;
using backend::code;

constexpr int kChainThreads = 128;  // 16 KB of register file a block

template <class T>
__device__ __forceinline__ T from_bits(uint64_t b) {
  if constexpr (std::is_same_v<T, float>)
    return __uint_as_float(static_cast<uint32_t>(b));
  else if constexpr (std::is_same_v<T, double>)
    return __longlong_as_double(static_cast<long long>(b));
  else if constexpr (std::is_same_v<T, bool>)
    return static_cast<uint8_t>(b) != 0;  // a bool's byte as stored: nonzero is true
  else if constexpr (is_half_v<T>)
    return T::from_bits(static_cast<uint16_t>(b));
  else
    return static_cast<T>(b);  // int32 from its low 32 bits, int64
}

template <class T>
__device__ __forceinline__ uint64_t to_bits(T v) {
  if constexpr (std::is_same_v<T, float>)
    return __float_as_uint(v);
  else if constexpr (std::is_same_v<T, double>)
    return static_cast<uint64_t>(__double_as_longlong(v));
  else if constexpr (std::is_same_v<T, bool>)
    return v ? 1u : 0u;
  else if constexpr (is_half_v<T>)
    return v.bits();
  else
    return static_cast<uint64_t>(static_cast<std::make_unsigned_t<T>>(v));
}

// Calls f with a value of DType t's element type (every dtype, the 16-bit floats included).
template <class F>
__device__ __forceinline__ uint64_t with_dtype(int t, F&& f) {
  switch (static_cast<DType>(t)) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::bf16:
      return f(bfloat16{});
    case DType::f16:
      return f(float16{});
    default:
      return f(bool{});
  }
}

__device__ __forceinline__ int bytes_of(int t) {
  switch (static_cast<DType>(t)) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    default:
      return 1;
  }
}

__device__ __forceinline__ uint64_t load_bits(const void* p, int t, int64_t off) {
  switch (bytes_of(t)) {
    case 8:
      return static_cast<const uint64_t*>(p)[off];
    case 4:
      return static_cast<const uint32_t*>(p)[off];
    case 2:
      return static_cast<const uint16_t*>(p)[off];
    default:
      return static_cast<const uint8_t*>(p)[off];
  }
}

__device__ __forceinline__ void store_bits(void* p, int t, int64_t off, uint64_t v) {
  switch (bytes_of(t)) {
    case 8:
      static_cast<uint64_t*>(p)[off] = v;
      break;
    case 4:
      static_cast<uint32_t*>(p)[off] = static_cast<uint32_t>(v);
      break;
    case 2:
      static_cast<uint16_t*>(p)[off] = static_cast<uint16_t>(v);
      break;
    default:
      static_cast<uint8_t*>(p)[off] = static_cast<uint8_t>(v);
      break;
  }
}

__device__ __forceinline__ uint64_t unary_value(const ChainStep& s, uint64_t a) {
  if (s.in == static_cast<uint8_t>(DType::bool_) && s.out == s.in) {
    return a;  // every unary op leaves a bool as it is: its byte as stored, as the copy kernel
  }
  if (s.op == code(backend::UnaryOp::copy)) {
    return with_dtype(s.in, [&](auto iv) {
      using I = decltype(iv);
      return with_dtype(s.out, [&](auto ov) {
        using O = decltype(ov);
        return to_bits(UnaryFn<0, I, O>{}(from_bits<I>(a)));
      });
    });
  }
  // in == out (the host checked): scalar::unary with the op by value, as UnaryFn<Code> with it
  // fixed (integers: the float-only ops leave the value as it is, as in the single-op launcher).
  return with_dtype(s.in, [&](auto tv) -> uint64_t {
    using T = decltype(tv);
    if constexpr (std::is_same_v<T, bool>)
      return a;
    else
      return to_bits(sc::unary(s.op, from_bits<T>(a)));
  });
}

template <class I, int... Op>
__device__ __forceinline__ uint64_t binary_pick(int op, I u, I v,
                                                std::integer_sequence<int, Op...>) {
  uint64_t r = 0;
  (void)((op == Op ? (r = to_bits(BinaryFn<Op, I>{}(u, v)), true) : false) || ...);
  return r;
}

__device__ __forceinline__ uint64_t binary_value(const ChainStep& s, uint64_t a, uint64_t b) {
  return with_dtype(s.in, [&](auto iv) -> uint64_t {
    using I = decltype(iv);
    const I u = from_bits<I>(a), v = from_bits<I>(b);
    if constexpr (std::is_same_v<I, float16>) {
      if ((s.flags & kChainRecipDiv) != 0) return to_bits(RecipDivFn<I>{}(u, v));
    }
    if constexpr (sc::is_float_v<I>) {
      return binary_pick<I>(s.op, u, v, std::make_integer_sequence<int, code(BinaryOp::ge) + 1>{});
    } else {
      // No division: the runtime divides integers as floats (the host refuses it).
      return binary_pick<I>(
          s.op, u, v,
          std::integer_sequence<int, code(BinaryOp::add), code(BinaryOp::sub), code(BinaryOp::mul),
                                code(BinaryOp::max), code(BinaryOp::min), code(BinaryOp::eq),
                                code(BinaryOp::ne), code(BinaryOp::lt), code(BinaryOp::le),
                                code(BinaryOp::gt), code(BinaryOp::ge)>{});
    }
  });
}

// One element: load the inputs (offsets from off(k)), run the ops, store element i of each output.
template <class Off>
__device__ __forceinline__ void run_element(const ChainLaunch& c, uint64_t* r, int64_t i,
                                            const Off& off) {
#pragma unroll
  for (int k = 0; k < kChainMaxInputs; ++k) {
    if (k < c.inputs && c.in[k].slot != kChainNoSlot)
      r[c.in[k].slot * kChainThreads] = load_bits(c.in[k].data, c.in[k].dtype, off(k));
  }
  for (int j = 0; j < c.ops; ++j) {
    const ChainStep& s = c.step[j];
    if (s.kind == kChainConstant) {  // reads no slot
      r[s.dst * kChainThreads] = s.bits;
      continue;
    }
    const uint64_t a = r[s.src[0] * kChainThreads];
    uint64_t v;
    if (s.kind == kChainUnary) {
      v = unary_value(s, a);
    } else if (s.kind == kChainBinary) {
      v = binary_value(s, a, r[s.src[1] * kChainThreads]);
    } else {
      v = SelectFn<uint64_t>{}(static_cast<uint8_t>(a), r[s.src[1] * kChainThreads],
                               r[s.src[2] * kChainThreads]);
    }
    r[s.dst * kChainThreads] = v;
  }
  for (int k = 0; k < c.outputs; ++k) {
    store_bits(c.out[k].data, c.out[k].dtype, i, r[c.out[k].slot * kChainThreads]);
  }
}

// The float32 chains (every value float32, every op float32 -> float32: arithmetic, max/min,
// neg/exp/.../relu, a float32 copy; no cast, comparison or select), the usual optimizer update or
// activation: values stay floats, each op one switch on its code, no dtype decoding. The same
// element functions as the general path (and the single-op kernels), so the same bits.
__device__ __forceinline__ float f32_step(const ChainStep& s, float a, float b) {
  if (s.kind == kChainUnary) {
    return s.op == code(backend::UnaryOp::copy) ? a : sc::unary(static_cast<int>(s.op), a);
  }
  switch (s.op) {
    case code(BinaryOp::add):
      return BinaryFn<code(BinaryOp::add), float>{}(a, b);
    case code(BinaryOp::sub):
      return BinaryFn<code(BinaryOp::sub), float>{}(a, b);
    case code(BinaryOp::mul):
      return BinaryFn<code(BinaryOp::mul), float>{}(a, b);
    case code(BinaryOp::div):
      return BinaryFn<code(BinaryOp::div), float>{}(a, b);
    case code(BinaryOp::max):
      return BinaryFn<code(BinaryOp::max), float>{}(a, b);
    default:
      return BinaryFn<code(BinaryOp::min), float>{}(a, b);
  }
}

template <class Off>
__device__ __forceinline__ void run_element(const ChainLaunch& c, float* r, int64_t i,
                                            const Off& off) {
#pragma unroll
  for (int k = 0; k < kChainMaxInputs; ++k) {
    if (k < c.inputs && c.in[k].slot != kChainNoSlot)
      r[c.in[k].slot * kChainThreads] = static_cast<const float*>(c.in[k].data)[off(k)];
  }
  for (int j = 0; j < c.ops; ++j) {
    const ChainStep& s = c.step[j];
    if (s.kind == kChainConstant) {  // reads no slot
      r[s.dst * kChainThreads] = __uint_as_float(static_cast<unsigned>(s.bits));
      continue;
    }
    const float a = r[s.src[0] * kChainThreads];
    const float b = s.kind == kChainBinary ? r[s.src[1] * kChainThreads] : 0.0f;
    r[s.dst * kChainThreads] = f32_step(s, a, b);
  }
  for (int k = 0; k < c.outputs; ++k) {
    static_cast<float*>(c.out[k].data)[i] = r[c.out[k].slot * kChainThreads];
  }
}

// Whether every value of `c` is float32 and every op maps float32 to float32 (f32_step's chains).
bool all_float32(const ChainLaunch& c) {
  const auto f32 = static_cast<uint8_t>(DType::f32);
  for (int k = 0; k < c.inputs; ++k) {
    if (c.in[k].slot != kChainNoSlot && c.in[k].dtype != f32) return false;
  }
  for (int j = 0; j < c.ops; ++j) {
    const ChainStep& s = c.step[j];
    if (s.in != f32 || s.out != f32 || s.flags != 0) return false;
    if (s.kind == kChainSelect) return false;
    if (s.kind == kChainConstant) continue;  // a float32 value (in == out == f32 above)
    if (s.kind == kChainBinary && s.op > code(BinaryOp::min)) return false;  // comparisons
    if (s.kind == kChainUnary && s.op > code(backend::UnaryOp::relu)) return false;
  }
  return true;
}

// Rank <= 2: elementwise.cuh's (rows, cols) walk, one element a thread at a time; input k's
// element (row, col) is at row * stride[0] + col * stride[1] (launch_chain puts them there).
// step_r/step_c: the grid's stride in rows and columns.
// Word: a value in the register file (uint64_t: any dtype's bits; float: the float32 chains).
template <class Word>
__global__ void __launch_bounds__(kChainThreads)
    chain_walk_kernel(const __grid_constant__ ChainLaunch c, int64_t n, int64_t cols,
                      int64_t step_r, int64_t step_c) {
  __shared__ Word file[kChainSlots * kChainThreads];
  Word* r = file + threadIdx.x;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  int64_t row = 0, col = first;
  if (first < n) {
    row = first / cols;
    col = first - row * cols;
  }
  for (int64_t i = first; i < n; i += step) {
    run_element(c, r, i, [&](int k) { return row * c.in[k].stride[0] + col * c.in[k].stride[1]; });
    col += step_c;
    row += step_r;
    if (col >= cols) {
      col -= cols;
      ++row;
    }
  }
}

// Rank > 2: element i's multi-index over the merged dims (one division per dimension, shared by
// the inputs), then each input's offset.
template <class Word>
__global__ void __launch_bounds__(kChainThreads)
    chain_strided_kernel(const __grid_constant__ ChainLaunch c, int64_t n) {
  __shared__ Word file[kChainSlots * kChainThreads];
  Word* r = file + threadIdx.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t idx[kMaxRank];
    int64_t rem = i;
#pragma unroll
    for (int d = kMaxRank - 1; d >= 0; --d) {
      idx[d] = 0;
      if (d < c.dims.rank) {
        const int64_t sz = c.dims.size[d];
        const int64_t q = rem / sz;
        idx[d] = rem - q * sz;
        rem = q;
      }
    }
    run_element(c, r, i, [&](int k) {
      int64_t o = 0;
#pragma unroll
      for (int d = 0; d < kMaxRank; ++d) o += idx[d] * c.in[k].stride[d];
      return o;
    });
  }
}

// Blocks of `kernel` resident per multiprocessor (cached per GPU and kernel; 1 when unknown):
// the grid is a full GPU's worth of resident blocks at most, so no block waits for a second wave.
template <auto* kernel>
int resident_blocks() {
  static std::atomic<int> cache[64];
  return per_gpu(cache, 1, [](int, int& v) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, reinterpret_cast<const void*>(kernel),
                                                         kChainThreads, 0) == cudaSuccess;
  });
}

int chain_grid(int64_t n, int per_sm) {
  const int64_t need = (n + kChainThreads - 1) / kChainThreads;
  const int64_t cap = int64_t{sm_count()} * per_sm;
  return static_cast<int>(need < 1 ? 1 : (need < cap ? need : cap));
}

}  // namespace

cudaError_t launch_chain(cudaStream_t s, const ChainLaunch& c, int64_t n) {
  if (n == 0) return cudaSuccess;
  if (c.ops < 1 || c.ops > kChainMaxOps || c.inputs < 0 || c.inputs > kChainMaxInputs ||
      c.outputs < 1 || c.outputs > kChainMaxOutputs || c.dims.rank < 0 || c.dims.rank > kMaxRank)
    return cudaErrorInvalidValue;
  for (int k = 0; k < c.outputs; ++k) {
    if (c.out[k].slot >= kChainSlots || c.out[k].data == nullptr) return cudaErrorInvalidValue;
  }
  // A planner bug is an error here, never a write past the register file.
  for (int k = 0; k < c.inputs; ++k) {
    if (c.in[k].slot != kChainNoSlot && c.in[k].slot >= kChainSlots) return cudaErrorInvalidValue;
  }
  for (int j = 0; j < c.ops; ++j) {
    const ChainStep& st = c.step[j];
    if (st.kind > kChainConstant || st.dst >= kChainSlots || st.src[0] >= kChainSlots ||
        st.src[1] >= kChainSlots || st.src[2] >= kChainSlots) {
      return cudaErrorInvalidValue;
    }
  }
  if (c.dims.rank <= 2) {
    // The walk reads (row stride, column stride) as stride[0], stride[1]: a rank-1 input's one
    // stride is its column stride.
    ChainLaunch w = c;
    const int64_t cols = c.dims.rank == 0 ? 1 : c.dims.size[c.dims.rank - 1];
    for (int k = 0; k < w.inputs; ++k) {
      int64_t* st = w.in[k].stride;
      const int64_t rs = c.dims.rank == 2 ? st[0] : 0,
                    cs = c.dims.rank >= 1 ? st[c.dims.rank - 1] : 0;
      st[0] = rs;
      st[1] = cs;
    }
    if (all_float32(c)) {
      const int grid = chain_grid(n, resident_blocks<&chain_walk_kernel<float>>());
      const int64_t step = int64_t{grid} * kChainThreads;
      chain_walk_kernel<float><<<grid, kChainThreads, 0, s>>>(w, n, cols, step / cols, step % cols);
    } else {
      const int grid = chain_grid(n, resident_blocks<&chain_walk_kernel<uint64_t>>());
      const int64_t step = int64_t{grid} * kChainThreads;
      chain_walk_kernel<uint64_t>
          <<<grid, kChainThreads, 0, s>>>(w, n, cols, step / cols, step % cols);
    }
  } else if (all_float32(c)) {
    const int grid = chain_grid(n, resident_blocks<&chain_strided_kernel<float>>());
    chain_strided_kernel<float><<<grid, kChainThreads, 0, s>>>(c, n);
  } else {
    const int grid = chain_grid(n, resident_blocks<&chain_strided_kernel<uint64_t>>());
    chain_strided_kernel<uint64_t><<<grid, kChainThreads, 0, s>>>(c, n);
  }
  return cudaGetLastError();
}

}  // namespace meshrt::cuda
