// backends/cuda/elementwise_ops.cuh: the element functions of the elementwise ops, one per op,
// shared by cuda_kernels.cu's single-op kernels and chain_kernels.cu's fused chains (device code;
// included by .cu files only), so an op in a chain computes exactly what its own kernel computes.
// Element semantics are backends/scalar_ops.h's (the cpu kernels' too).
//
// float32/float64 add, sub and mul are the round-to-nearest intrinsics: the same IEEE operation
// as the plain operators, but never contracted with a neighbouring multiply or add into an FMA.
// A single-op kernel has no neighbour to contract with; a chain does (a*b then +c would become one
// fma and change the bits), and the intrinsics keep every op rounded on its own there too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backends/op_codes.h"
#include "backends/scalar_ops.h"

namespace meshrt::cuda {

// backend::UnaryOp: 0 = copy/astype (scalar::convert), 1.. = scalar::unary's codes (in == out).
template <int Code, class I, class O>
struct UnaryFn {
  __device__ __forceinline__ O operator()(I v) const {
    if constexpr (Code == 0)
      return backend::scalar::convert<O>(v);
    else
      return backend::scalar::unary(Code, v);
  }
};

// backend::BinaryOp (backends/op_codes.h), by code(op).
template <int Op, class I>
struct BinaryFn {
  using Out = std::conditional_t<(Op >= backend::code(backend::BinaryOp::eq)), bool, I>;
  __device__ __forceinline__ Out operator()(I u, I v) const {
    namespace sc = backend::scalar;
    using backend::BinaryOp;
    using backend::code;
    if constexpr (Op == code(BinaryOp::add)) {
      if constexpr (std::is_same_v<I, float>)
        return __fadd_rn(u, v);
      else if constexpr (std::is_same_v<I, double>)
        return __dadd_rn(u, v);
      else
        return sc::wrap_add(u, v);
    } else if constexpr (Op == code(BinaryOp::sub)) {
      if constexpr (std::is_same_v<I, float>)
        return __fsub_rn(u, v);
      else if constexpr (std::is_same_v<I, double>)
        return __dsub_rn(u, v);
      else
        return sc::wrap_sub(u, v);
    } else if constexpr (Op == code(BinaryOp::mul)) {
      if constexpr (std::is_same_v<I, float>)
        return __fmul_rn(u, v);
      else if constexpr (std::is_same_v<I, double>)
        return __dmul_rn(u, v);
      else
        return sc::wrap_mul(u, v);
    } else if constexpr (Op == code(BinaryOp::div)) {
      return u / v;  // floats only (the runtime divides integers as floats); IEEE (-prec-div)
    } else if constexpr (Op == code(BinaryOp::max)) {
      return sc::max_nan(u, v);
    } else if constexpr (Op == code(BinaryOp::min)) {
      return sc::min_nan(u, v);
    } else if constexpr (Op == code(BinaryOp::eq)) {
      return u == v;
    } else if constexpr (Op == code(BinaryOp::ne)) {
      return u != v;
    } else if constexpr (Op == code(BinaryOp::lt)) {
      return u < v;
    } else if constexpr (Op == code(BinaryOp::le)) {
      return u <= v;
    } else if constexpr (Op == code(BinaryOp::gt)) {
      return u > v;
    } else {
      return u >= v;
    }
  }
};

// float16 divided by a broadcast divisor: the product with the divisor's reciprocal rounded to
// float16, as the cpu kernel (XLA's cpu, checked against JAX 0.10.2); when: divisor_broadcast
// (cuda_kernels.h).
template <class I>
struct RecipDivFn {
  __device__ __forceinline__ I operator()(I u, I v) const {
    return u * I(1.0f / static_cast<float>(v));
  }
};

// The condition is a bool's byte as stored: any nonzero byte picks a (as the cpu kernel).
template <class T>
struct SelectFn {
  __device__ __forceinline__ T operator()(uint8_t c, T a, T b) const { return c != 0 ? a : b; }
};

}  // namespace meshrt::cuda
