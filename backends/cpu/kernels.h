// backends/cpu/kernels.h: the cpu implementations of the backend kernels (host pointers).
//
// Inner loops are written for the compiler to vectorise (OpenMP SIMD); sizes above a threshold
// are split across one process-wide oneTBB arena sized to the machine's cores, so 8 simulated
// devices on 2 cores share 2 cores instead of oversubscribing them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backends/backend.h"

namespace meshrt::cpu {

void unary(backend::UnaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
           const backend::Strided& x, void* y);
void binary(backend::BinaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
            const backend::Strided& a, const backend::Strided& b, void* y);
void select(DType dtype, const std::vector<int64_t>& shape, const backend::Strided& cond,
            const backend::Strided& a, const backend::Strided& b, void* y);
// An elementwise chain (Backend::elementwise_chain) a cache-sized tile at a time: each op runs
// over the tile as its own kernel above, the intermediates in per-thread scratch, in parallel
// over tiles; a tile's earlier outputs are copied out of the scratch after its last op.
// chain_takes: whether it fuses `chain` (all but float16 division, whose reciprocal path depends on
// the whole shape's broadcast).
bool chain_takes(const backend::ElementwiseChain& chain);
void elementwise_chain(const backend::ElementwiseChain& chain, const std::vector<int64_t>& shape,
                       std::span<const backend::Strided> inputs, std::span<void* const> ys);
void reduce(backend::ReduceOp op, DType dtype, int64_t outer, int64_t len, int64_t inner,
            const void* x, void* y);
// trans_a: a is stored (k, m); trans_b: b is stored (n, k) (Backend::matmul_t).
void matmul(DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, const void* a,
            const void* b, void* c, bool trans_a = false, bool trans_b = false);
void fill(DType dtype, int64_t n, double value, bool iota, void* y);
// A pitched copy (cudaMemcpy2D semantics); large ones are split across the arena (a reshard's
// copies from the caller's thread then use every core, as the kernels do).
void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
// Pitched copies whose destinations overlap no other copy (Backend::copy_2d_batch), split into
// pieces across the arena when they are large together, however small each one is.
void copy_2d_batch(const std::vector<backend::DeviceCopy>& copies);
// Makes BLAS calls single-threaded: large products are split across the shared oneTBB arena
// instead (matmul), which hands out the process's cores among the devices busy at the time.
void configure_blas_threads();

}  // namespace meshrt::cpu
