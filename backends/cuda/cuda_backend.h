// backends/cuda/cuda_backend.h: the cuda platform's backend, declared once for its parts (not
// installed):
//   cuda_backend.cpp     logical devices, peer access, memory (allocator, block cache), copies and
//                        pinned staging
//   ops.cpp              op kernels and cuBLAS matmul, queued on the compute stream
//   fused_ops.cpp        fused elementwise pairs and chains for jit (fused_kernels.cu,
//                        chain_kernels.cu)
//   matmul_lt.cpp        cuBLASLt products and their bias/relu epilogues (MESHRT_CUDA_MATMUL=lt)
//   graphs.cpp           jit's compiled steps as CUDA graphs (MESHRT_CUDA_GRAPHS=1)
//   coll_primitives.cpp  collective copy/fold/signal/wait/fence on the communication stream
//   nccl.cpp             the NativeComm for NCCL
//
// Each visible GPU is split into MESHRT_CUDA_DEVICES_PER_GPU = k logical devices (default 1). A
// logical device has its own host executor thread bound to its GPU (or, under
// MESHRT_CUDA_EXECUTOR=fibers, a fiber), a compute stream (op
// kernels, cuBLAS), a communication stream (collective copies and reductions, NCCL), a caching
// allocator with its own accounting, and pinned staging for host copies.
//
// Ordering (see also collectives/plane.h):
//   * op kernels are queued on the compute stream and return at once;
//   * copy_2d with the host (device_put, to_vector) is synchronous: it orders itself after the
//     device's compute stream and waits; between devices (resharding) it is stream-ordered and
//     returns at once: queued on the destination's compute stream after the source's queued
//     work, and the source's compute stream waits for it (device_copy);
//   * a device joining a collective first waits for its compute stream (its input is complete and
//     no earlier kernel still uses memory a peer may now write); the collective's own work runs on
//     the communication stream and is fenced (stream synchronised) before a peer or the host is
//     told it is done, so compute queued between an async collective's start and its wait overlaps
//     with the transfer.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/block_cache.h"
#include "backends/native_comm.h"
#include "core/threads/executor.h"
#include "core/threads/fiber_executor.h"

namespace meshrt::cuda {

std::string dev_name(int d);

// A logical device's cuBLASLt plans, one per product shape (matmul_lt.cpp).
struct LtPlans;
// A logical device's captured CUDA graphs (graphs.cpp).
struct GraphCache;
// The CUDA graph capture the calling thread is in (CudaBackend::run_graph), or null: work that
// cannot be captured (an allocation, a host wait) marks it unusable, and the capture is dropped.
// The capture runs on the device's own capture stream (Logical::capture), never on its compute
// stream, which other threads go on using; ops_stream() routes the capturing thread's work there.
struct Capture {
  bool ok = true;
  int device = -1;
  cudaStream_t stream = nullptr;
  // Blocks freed back to the driver during the capture (a cudaFree there would fail): released
  // when it ends.
  std::vector<std::pair<int, void*>> to_release;
};
extern thread_local Capture* t_capture;

// One logical device.
struct Logical {
  int gpu = 0;
  cudaStream_t compute = nullptr;
  cudaStream_t comm = nullptr;
  std::mutex blas_mu;  // a cuBLAS handle is not for two threads at once
  cublasHandle_t blas = nullptr;
  // cuBLASLt (MESHRT_CUDA_MATMUL=lt), guarded by blas_mu: the handle, its workspace and the
  // plan of every product shape this device has run (made on first use).
  cublasLtHandle_t lt = nullptr;
  std::shared_ptr<backend::Buffer> lt_workspace;
  std::shared_ptr<LtPlans> lt_plans;
  // A float32 +0.0 for matmul_drelu's unfused relu gradient (made by its first call, outside any
  // graph capture), guarded by blas_mu.
  std::shared_ptr<backend::Buffer> zero_f32;
  // CUDA graphs of jit's compiled steps (MESHRT_CUDA_GRAPHS=1), guarded by graphs_mu; captures
  // run one at a time per device (capture_mu, try-locked) on `capture`, made with the first.
  std::mutex graphs_mu;
  std::shared_ptr<GraphCache> graphs;
  std::mutex capture_mu;
  cudaStream_t capture = nullptr;
  // cuBLAS's workspace under MESHRT_CUDA_GRAPHS=1 (cublasSetWorkspace after every
  // cublasSetStream), so eager and captured products see one workspace and one algorithm.
  std::shared_ptr<backend::Buffer> blas_workspace;
  std::unique_ptr<backend::BlockCache> cache;
  std::atomic<int64_t> in_use{0};  // bytes handed out and not yet freed
  std::mutex stage_mu;
  char* staging = nullptr;  // 2 x kStagingBytes pinned
  cudaEvent_t staged[2] = {nullptr, nullptr};
  // Temporaries the communication stream may still read; released at the next fence. Touched
  // only by the device's own executor thread.
  std::vector<std::shared_ptr<backend::Buffer>> hold;
  std::mutex events_mu;
  std::vector<cudaEvent_t> spare_events;  // guarded by events_mu: recycled progress tokens
  // coll_fence calls that found the communication stream drained (written by the device's own
  // executor thread): NCCL work launched before a fence that completed is done.
  std::atomic<uint64_t> fences{0};
  std::unique_ptr<core::Executor> exec;  // null under fibers (CudaBackend::fibers_)
  // Marks the compute stream's progress for another device's stream to wait on (order_after).
  std::mutex order_mu;
  cudaEvent_t order = nullptr;
};

class CudaBackend final : public backend::Backend {
 public:
  CudaBackend();
  // Leaked with the registry at exit (executors may still run); nothing to release that the
  // driver does not reclaim with the process.
  ~CudaBackend() override = default;

  std::string_view platform() const override { return "cuda"; }
  int device_count() const override { return static_cast<int>(devs_.size()); }
  std::string unavailable_reason() const override { return reason_; }

  // ---- memory and copies (cuda_backend.cpp)
  std::shared_ptr<backend::Buffer> allocate(int device, size_t bytes) override;
  void deallocate(int device, void* data, size_t bytes) noexcept override;
  void copy_2d(void* dst, int dst_device, size_t dpitch, const void* src, int src_device,
               size_t spitch, size_t width, size_t height) override;
  // Copies whose two logical devices share a GPU: per GPU, one wait on each device involved,
  // one launch (launch_copy_batch) on the first destination's compute stream, and every device
  // involved waits for it; others as copy_2d. MESHRT_CUDA_SYNC_COPIES=1: copy_2d each.
  void copy_2d_batch(const std::vector<backend::DeviceCopy>& copies) override;
  // A logical device's tasks run on its own host thread, or (MESHRT_CUDA_EXECUTOR=fibers, one
  // GPU) as fibers on one worker thread that a launching thread drives itself (drive/claim), so
  // a shard_map call and a collective's meeting cost no thread wake-ups.
  void submit(int device, std::function<void()> task) override;
  bool drive(int device, const std::atomic<uint32_t>& done) override;
  bool claim(int device) override;
  // Both streams of the logical device drained; a failure of queued work is raised here.
  void synchronize(int device) override;

  // ---- op kernels (ops.cpp)
  void unary(int device, backend::UnaryOp op, DType in, DType out,
             const std::vector<int64_t>& shape, const backend::Strided& x, void* y) override;
  void binary(int device, backend::BinaryOp op, DType in, DType out,
              const std::vector<int64_t>& shape, const backend::Strided& a,
              const backend::Strided& b, void* y) override;
  void select(int device, DType dtype, const std::vector<int64_t>& shape,
              const backend::Strided& cond, const backend::Strided& a, const backend::Strided& b,
              void* y) override;
  void reduce(int device, backend::ReduceOp op, DType dtype, int64_t outer, int64_t len,
              int64_t inner, const void* x, void* y) override;
  // ---- fused elementwise pairs (fused_ops.cpp): one kernel, the pair's bits
  bool fuses_pairs() const override { return true; }
  // ---- fused elementwise chains (fused_ops.cpp, chain_kernels.cu), under
  // MESHRT_CUDA_FUSION=chains: one kernel, the chain's ops' bits; elsewhere (off, or a chain
  // past the kernel's limits) the default.
  bool fuses_chain(const backend::ElementwiseChain& chain) const override;
  void elementwise_chain(int device, const backend::ElementwiseChain& chain,
                         const std::vector<int64_t>& shape,
                         std::span<const backend::Strided> inputs,
                         std::span<void* const> ys) override;
  void binary_unary(int device, backend::BinaryOp bop, backend::UnaryOp uop, DType dtype,
                    const std::vector<int64_t>& shape, const backend::Strided& a,
                    const backend::Strided& b, void* y) override;
  void compare_select(int device, backend::BinaryOp cmp, DType in, DType dtype,
                      const std::vector<int64_t>& shape, const backend::Strided& x0,
                      const backend::Strided& x1, const backend::Strided& a,
                      const backend::Strided& b, void* y) override;
  void matmul(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
              const void* a, const void* b, void* c) override;
  // cuBLAS's transposed products: no operand is copied (integers: transposed copies first).
  void matmul_prec(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                   const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                   Precision precision) override;
  void matmul_t(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                const void* a, bool trans_a, const void* b, bool trans_b, void* c) override;
  void fill(int device, DType dtype, int64_t n, double value, bool iota, void* y) override;
  // ---- cuBLASLt epilogues (matmul_lt.cpp), under MESHRT_CUDA_MATMUL=lt: one cublasLtMatmul with
  // the BIAS or RELU_BIAS epilogue, through the algorithm the plain product of that shape uses
  // (so the bits are the product's, then the bias add, then relu, as unfused); elsewhere (other
  // dtypes, no algorithm, a bias off 16-byte alignment) the unfused calls.
  bool fuses_matmul_bias() const override { return lt_; }
  int64_t fused_matmul_bias_calls() const override {
    return fused_matmul_bias_.load(std::memory_order_relaxed);
  }
  void matmul_bias(int device, DType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                   bool trans_a, const void* b, bool trans_b, Precision precision, const void* bias,
                   bool relu, void* y) override;
  // relu's gradient in the epilogue (cuBLASLt's DRELU, a relu mask made from the forward's
  // output by one small kernel), where a probe per shape finds it gives the unfused calls' bits;
  // elsewhere the unfused calls.
  bool fuses_matmul_drelu() const override { return lt_; }
  int64_t fused_matmul_drelu_calls() const override {
    return fused_matmul_drelu_.load(std::memory_order_relaxed);
  }
  void matmul_drelu(int device, DType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                    bool trans_a, const void* b, bool trans_b, Precision precision,
                    const void* relu_out, void* y) override;

  // ---- CUDA graphs (graphs.cpp), under MESHRT_CUDA_GRAPHS=1: body's work is captured from the
  // compute stream the second time a key meets the same addresses, and launched as one graph
  // from then on (graphs.cpp says what may not be captured and what happens then).
  bool run_graph(int device, uint64_t key, const void* const* addresses, size_t count,
                 backend::BodyRef body) override;
  int64_t graph_launches() const override {
    return graph_launches_.load(std::memory_order_relaxed);
  }

  // ---- collective primitives (coll_primitives.cpp)
  void coll_begin(int device) override;
  // An event recorded on the compute stream (a spare progress token).
  void* coll_begin_token(int device) override;
  void coll_copy_2d(int device, void* dst, size_t dpitch, const void* src, size_t spitch,
                    size_t width, size_t height) override;
  void coll_zero(int device, void* dst, size_t bytes) override;
  void coll_fold(int device, backend::FoldOp op, DType in, DType out, void* dst,
                 const std::vector<const void*>& srcs, int64_t len) override;
  void coll_fold_rows(int device, backend::FoldOp op, DType dtype, void* dst, int64_t dpitch,
                      const std::vector<const void*>& srcs, int64_t spitch, int64_t len,
                      int64_t rows) override;
  // psum/pmax/pmin with in == out and at most kMaxFoldTo sources and outputs: one kernel that
  // reads every source once and writes every output; otherwise the default (fold, then copies).
  void coll_fold_to(int device, backend::FoldOp op, DType in, DType out,
                    const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                    int64_t len) override;
  void coll_mean(int device, DType in, DType out, void* dst, const void* sum, int64_t len,
                 int64_t divisor) override;
  void coll_fence(int device) override;
  void* coll_signal(int device) override;
  void coll_wait_token(int device, void* token) override;
  void coll_release_token(int device, void* token) noexcept override;
  void coll_order_compute(int device, void* token) override;
  // Members on different GPUs must reach each other's memory: their copies and fold kernels
  // read peers' buffers directly.
  std::string direct_unavailable(const std::vector<int>& group) override;

  // ---- NCCL (nccl.cpp); null when there is no GPU.
  backend::NativeComm* native_comm() override { return nccl_.get(); }

  // ---- shared by the parts
  Logical& dev(int device) { return *devs_[static_cast<size_t>(device)]; }
  int per_gpu() const { return per_gpu_; }
  // Makes `device`'s GPU current on the calling thread.
  void set(int device);
  void sync(int device, cudaStream_t s);
  // The stream `device`'s op kernels go to: its compute stream, or the capture stream while this
  // thread captures a graph for it (graphs.cpp).
  cudaStream_t ops_stream(int device) {
    return t_capture != nullptr && t_capture->device == device ? t_capture->stream
                                                               : dev(device).compute;
  }
  // A pitched copy (cudaMemcpy2D semantics, cudaMemcpyDefault) queued on `s`: one 1-D copy where
  // rows are contiguous, row by row where a pitch exceeds what cudaMemcpy2D accepts.
  cudaError_t copy_async(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height, cudaStream_t s) const;

 private:
  // The one cuBLAS call behind matmul, matmul_t and matmul_prec (row-major, either operand read
  // transposed through cuBLAS's op flags).
  void gemm(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, const void* a,
            bool trans_a, const void* b, bool trans_b, void* c, Precision precision);
  // A float32 product of one row-major (m, n) matrix through cuBLASLt on `device`'s compute
  // stream, with epilogue 0 (none), 1 (+ bias row) or 2 (+ bias row, then relu). Returns false,
  // having queued nothing, when cuBLASLt has no algorithm for the shape, its operands' alignment
  // and all three epilogues (the caller then takes cuBLAS's classic GEMM); the choice is made
  // once per shape and alignment, so a shape takes one path with or without its epilogue.
  bool lt_gemm(int device, int64_t m, int64_t n, int64_t k, const void* a, bool trans_a,
               const void* b, bool trans_b, void* c, Precision precision, const void* bias,
               int epilogue);
  // matmul_drelu through cuBLASLt's DRELU epilogue: false, having queued nothing the caller
  // needs, where the shape has no plan, the plan's algorithm refuses DRELU or its probe found
  // other bits than the unfused calls' (the caller then runs those).
  bool lt_drelu(int device, int64_t m, int64_t n, int64_t k, const void* a, bool trans_a,
                const void* b, bool trans_b, Precision precision, const void* relu_out, void* y);
  // A recycled (or new) event recorded on `s`, `device`'s stream.
  cudaEvent_t record_token(int device, cudaStream_t s);
  void init_peer_access();
  void release_block(int device, void* p) noexcept;
  void device_copy(void* dst, int dst_device, size_t dpitch, const void* src, int src_device,
                   size_t spitch, size_t width, size_t height);
  void order_after(int waiter, int producer);
  void staged_copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes);
  void drain(Logical& l, int device, int half, char* to, size_t n);
  // dst = fold of srcs (left to right; launch_fold_rows splits it into launches of at most
  // kMaxFoldSources sources, and a 16-bit fold still rounds once).
  void fold_chain(int device, int op, DType t, void* dst, int64_t dpitch,
                  const std::vector<const void*>& srcs, int64_t spitch, int64_t len, int64_t rows);

  std::string reason_;
  std::chrono::duration<double> fence_timeout_{300.0};
  bool sync_copies_ = false;                 // MESHRT_CUDA_SYNC_COPIES
  bool lt_ = false;                          // MESHRT_CUDA_MATMUL=lt
  bool graphs_ = false;                      // MESHRT_CUDA_GRAPHS=1
  bool chains_ = false;                      // MESHRT_CUDA_FUSION=chains
  std::unique_ptr<core::FiberPool> fibers_;  // MESHRT_CUDA_EXECUTOR=fibers
  std::atomic<int64_t> graph_launches_{0};
  std::atomic<int64_t> fused_matmul_bias_{0};
  std::atomic<int64_t> fused_matmul_drelu_{0};
  int gpus_ = 0;
  int per_gpu_ = 1;
  size_t max_pitch_ = 0;  // the smallest cudaDevAttrMaxPitch of the GPUs
  // Why GPU a cannot reach GPU b's memory, at [a * gpus_ + b] ("" when it can); fixed after
  // construction.
  std::vector<std::string> no_peer_;
  std::vector<std::unique_ptr<Logical>> devs_;
  std::unique_ptr<backend::NativeComm> nccl_;
};

// The NativeComm over NCCL for `backend`'s logical devices (nccl.cpp).
std::unique_ptr<backend::NativeComm> make_nccl_comm(CudaBackend& backend);

}  // namespace meshrt::cuda
