// core/config.h: every MESHRT_* environment variable, parsed and validated in one place.
//
// Each getter reads the variable when called (a program may set it before the first use of
// what it controls) and throws meshrt::Error, naming the variable, the bad value and a valid
// example, when the value is malformed. `variables()` is the table the README documents.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshrt::config {

// One documented variable: its name, the values it takes, its default, and what it does.
struct Variable {
  std::string_view name;
  std::string_view values;
  std::string_view default_value;
  std::string_view meaning;
};
const std::vector<Variable>& variables();

inline constexpr int kMaxCpuDevices = 4096;
inline constexpr int kMaxCudaDevicesPerGpu = 64;

// MESHRT_CPU_DEVICES: simulated cpu devices, 1..kMaxCpuDevices (default 1).
int cpu_devices();
// MESHRT_PLATFORM: "cpu", "cuda", or empty when unset (the runtime then picks).
std::string platform();
// MESHRT_CPU_EXECUTOR: how simulated devices run.
enum class CpuExecutor { threads, fibers, automatic };
CpuExecutor cpu_executor();
// MESHRT_COLLECTIVE_ALGO: "auto" (default), "direct", "ring", "bidi_ring" or "native".
std::string collective_algo();
// MESHRT_DETERMINISTIC: 0 (default) or 1.
bool deterministic();
// MESHRT_COLLECTIVE_TIMEOUT: seconds (> 0) before a collective whose peers never arrive fails.
std::chrono::milliseconds collective_timeout();
// The default of MESHRT_MPI_MAX_MESSAGE_BYTES: MPI's int count (INT_MAX) rounded down to 64 bytes.
inline constexpr int64_t kMpiMaxMessageBytes = (int64_t{INT32_MAX} / 64) * 64;
// MESHRT_MPI_MAX_MESSAGE_BYTES: the most bytes one MPI message carries, 16..INT32_MAX (default
// kMpiMaxMessageBytes); a transfer between processes above it moves as several messages. A
// testing knob: a small value drives the splitting with small transfers.
int64_t mpi_max_message_bytes();
// MESHRT_CUDA_DEVICES_PER_GPU: logical cuda devices per GPU, 1..kMaxCudaDevicesPerGpu (default 1).
int cuda_devices_per_gpu();
// MESHRT_CUDA_CACHE_BYTES: freed GPU bytes each logical device keeps; unset: the backend's default.
std::optional<size_t> cuda_cache_bytes();
// MESHRT_CUDA_SYNC_COPIES: 0 (default) or 1: device-to-device copies wait on the host.
bool cuda_sync_copies();
// MESHRT_CUDA_MATMUL: "cublas" (default: cuBLAS's classic GEMM) or "lt" (float32 products of one
// matrix through cuBLASLt, and jit's layer epilogues fused into them: backends/cuda/matmul_lt.cpp).
bool cuda_matmul_lt();
// MESHRT_CUDA_GRAPHS: 0 (default) or 1: jit's compiled steps on cuda as CUDA graphs
// (backends/cuda/graphs.cpp).
bool cuda_graphs();
// MESHRT_CUDA_FUSION: "pairs" (default: jit fuses a bias add with relu and a comparison with its
// select) or "chains" (every elementwise chain the GPU kernel takes:
// backends/cuda/chain_kernels.cu).
bool cuda_fusion_chains();
// MESHRT_JIT_FUSION: 1 (default) or 0: jit fuses no kernels at all (for comparisons).
bool jit_fusion();
// MESHRT_CUDA_EXECUTOR: "threads" (default: a host thread per logical device) or "fibers" (one
// GPU's logical devices as fibers on one thread, core/threads/fiber_executor.h): true for fibers.
bool cuda_fibers();
// MESHRT_SHARDING: false for "auto" (default), true for "explicit".
bool explicit_sharding();
// MESHRT_MATMUL_PLACEMENT: "auto" (default: by bytes on host-memory platforms, jax.jit's on device
// platforms, where the measured step was faster so), "cheapest" (the placement that moves the
// fewest bytes), "jax" (always the placement jax.jit gives a matmul).
enum class MatmulPlacement { automatic, cheapest, jax };
MatmulPlacement matmul_placement();
// MESHRT_KEEP_ROWS: 1 (default) or 0. 1: a product the global view computes as rows stays there
// until read in jax.jit's sharding (global/array_ops.cpp, keep_as_rows); 0: moved at once.
bool keep_rows();
// MESHRT_CPU_STREAM_STORES: 1 (default) or 0. 1: a cpu collective fold that writes at least
// kStreamStoreBytes in one call (a large psum's slice into every member's output), and a
// collective copy of at least kStreamCopyBytes, write with non-temporal stores on CPUs with AVX2
// (backends/cpu/coll_primitives.h); 0: through the cache (for comparisons).
bool cpu_stream_stores();
// MESHRT_LOG_COLLECTIVES: 0 (default) or 1.
bool log_collectives();
// MESHRT_REQUIRE_CUDA: 0 (default) or 1; 1 makes the test suites' cuda runs fail instead of
// skipping when the cuda platform is not usable (GPU CI).
bool require_cuda();
// MESHRT_PRNG_STREAM: the bit stream of random::key(seed) when no stream is passed: false for
// "current" (default, JAX >= 0.5), true for "legacy" (JAX 0.4.x).
bool prng_legacy_stream();
// MESHRT_MATMUL_PRECISION: "highest" (default: true fp32) or "tf32" (tensor cores on GPUs).
bool matmul_tf32();
// MESHRT_PLUGIN_DIR: the folder holding the platform plugins; unset (or empty): look next to the
// core library, then on the loader's path (backends/plugin.h).
std::optional<std::string> plugin_dir();

// Not meshrt's own: how many processes of this job the launcher started on this host
// (OMPI_COMM_WORLD_LOCAL_SIZE under Open MPI's mpirun, MPI_LOCALNRANKS under MPICH's); 1 when
// none says so or the value is not a positive number.
int launcher_local_processes();

}  // namespace meshrt::config
