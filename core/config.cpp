#include "core/config.h"

#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "core/strings.h"

namespace meshrt::config {
namespace {

// The value of `name`, or nullopt when unset or empty.
std::optional<std::string> raw(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

[[noreturn]] void bad(std::string_view component, std::string_view name, const std::string& value,
                      std::string_view expected) {
  throw Error(detail::cat("[", component, "] ", name, "='", value, "' is not ", expected));
}

int64_t integer(const char* name, std::string_view component, int64_t lo, int64_t hi, int64_t dflt,
                std::string_view expected) {
  auto v = raw(name);
  if (!v) return dflt;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || x < lo || x > hi) bad(component, name, *v, expected);
  return x;
}

std::string choice(const char* name, std::string_view component,
                   std::vector<std::string_view> allowed) {
  auto v = raw(name);
  if (!v) return std::string(allowed.front());
  for (std::string_view a : allowed) {
    if (*v == a) return *v;
  }
  bad(component, name, *v,
      detail::cat("one of ",
                  detail::join(allowed, ", ", [](std::string_view a) { return std::string(a); })));
}

bool flag(const char* name, std::string_view component) {
  return choice(name, component, {"0", "1"}) == "1";
}

}  // namespace

const std::vector<Variable>& variables() {
  static const std::vector<Variable> table = {
      {"MESHRT_CPU_DEVICES", "1..4096", "1",
       "number of simulated cpu devices (set_cpu_device_count(n) before first use wins)"},
      {"MESHRT_PLATFORM", "cpu, cuda", "cuda if usable, else cpu",
       "default platform for devices() / make_mesh (set_cpu_device_count picks cpu)"},
      {"MESHRT_CPU_EXECUTOR", "threads, fibers, auto", "auto",
       "how simulated devices run: one thread each, fibers on one worker per core, or fibers when "
       "devices outnumber cores"},
      {"MESHRT_COLLECTIVE_ALGO", "auto, direct, ring, bidi_ring, native", "auto",
       "collective algorithm when a call does not choose"},
      {"MESHRT_DETERMINISTIC", "0, 1", "0",
       "1: reductions give direct's bits under every algorithm"},
      {"MESHRT_COLLECTIVE_TIMEOUT", "seconds > 0", "300",
       "seconds before a collective whose peers never arrive is an error"},
      {"MESHRT_MPI_MAX_MESSAGE_BYTES", "16..2147483647", "2147483584",
       "testing: the most bytes one MPI message between processes carries; larger transfers "
       "move as several messages (a small value tests that splitting); every process must use "
       "the same value"},
      {"MESHRT_CUDA_DEVICES_PER_GPU", "1..64", "1",
       "logical cuda devices per GPU, each with its own executor, streams and memory accounting"},
      {"MESHRT_CUDA_CACHE_BYTES", "bytes >= 0", "a quarter of the GPU's share",
       "freed GPU memory each logical cuda device keeps for reuse"},
      {"MESHRT_CUDA_SYNC_COPIES", "0, 1", "0",
       "1: copies between cuda devices wait on the host before and after (as before they were "
       "stream-ordered), to rule an ordering problem in or out"},
      {"MESHRT_CUDA_MATMUL", "cublas, lt", "cublas",
       "lt: float32 products of one matrix go through cuBLASLt with its algorithm chosen once per "
       "shape (the bias epilogue's), and jit folds a layer's bias add and relu into the product "
       "(cuBLASLt's BIAS / RELU_BIAS epilogues); cublas: cuBLAS's classic GEMM, epilogues unfused"},
      {"MESHRT_CUDA_EXECUTOR", "threads, fibers", "threads",
       "how logical cuda devices run their tasks: a host thread each, or (one GPU only) fibers on "
       "one thread that the launching thread drives itself, as the cpu platform's fibers"},
      {"MESHRT_CUDA_GRAPHS", "0, 1", "0",
       "1: jit's compiled steps on cuda are captured as CUDA graphs where their addresses repeat "
       "(the second call that meets them) and launched as one graph per step and device"},
      {"MESHRT_CUDA_FUSION", "pairs, chains", "pairs",
       "chains: jit fuses every chain of elementwise kernels that the GPU kernel takes (up to 32 "
       "ops, 8 inputs, 16 values live at once) into one kernel on cuda; pairs: only a bias add "
       "with relu and a comparison with its select"},
      {"MESHRT_JIT_FUSION", "0, 1", "1",
       "0: jit fuses no kernels (no elementwise chains or pairs, no product epilogues), for "
       "comparisons and to rule fusion in or out"},
      {"MESHRT_SHARDING", "auto, explicit", "auto",
       "explicit: an implicit reshard in a global-view op is an error"},
      {"MESHRT_MATMUL_PLACEMENT", "auto, cheapest, jax", "auto",
       "how the global view computes a 2-D matmul of sharded operands: cheapest moves the fewest "
       "bytes (e.g. rows of the lhs instead of partial products) and then reshards to the "
       "sharding jax.jit gives; jax always computes it as jax.jit does; auto: cheapest on host "
       "memory (cpu), jax on a device platform (cuda)"},
      {"MESHRT_KEEP_ROWS", "0, 1", "1",
       "1: a matmul the global view computes as rows keeps its product there (and the elementwise "
       "ops, sums and matmuls over it compute there) until something reads it in the sharding "
       "jax.jit gives; 0: moves each product to that sharding at once (for comparisons)"},
      {"MESHRT_CPU_STREAM_STORES", "0, 1", "1",
       "1: on CPUs with AVX2, a cpu psum/pmean/pmax/pmin fold that writes at least 4 MiB of "
       "outputs at once, and a collective copy of at least 2 MiB, write with non-temporal "
       "(streaming) stores: each output written once without being read first; 0: through the "
       "cache (for comparisons)"},
      {"MESHRT_LOG_COLLECTIVES", "0, 1", "0", "1: print every collective the global view inserts"},
      {"MESHRT_REQUIRE_CUDA", "0, 1", "0",
       "tests: 1 makes a cuda run on a machine where cuda is not usable a failure, not a skip"},
      {"MESHRT_MATMUL_PRECISION", "highest, tf32", "highest",
       "matmul precision when a call does not choose (tf32: tensor cores on GPUs; cpu computes "
       "full precision); set_default_matmul_precision wins"},
      {"MESHRT_PLUGIN_DIR", "a folder", "unset: next to libmeshrt, then the loader's path",
       "where the platform plugins libmeshrt_cuda.so and libmeshrt_mpi.so are looked for"},
      {"MESHRT_PRNG_STREAM", "current, legacy", "current",
       "bit stream of random::key(seed) when no stream is passed: current (JAX >= 0.5) or legacy "
       "(JAX 0.4.x); random::set_default_stream wins"},
  };
  return table;
}

int cpu_devices() {
  return static_cast<int>(integer("MESHRT_CPU_DEVICES", "devices", 1, kMaxCpuDevices, 1,
                                  detail::cat("a device count between 1 and ", kMaxCpuDevices,
                                              "; set it to the number of simulated cpu devices, "
                                              "e.g. MESHRT_CPU_DEVICES=8")));
}

std::string platform() {
  auto v = raw("MESHRT_PLATFORM");
  if (!v) return "";
  if (*v != "cpu" && *v != "cuda")
    bad("devices", "MESHRT_PLATFORM", *v, "a platform; use cpu or cuda");
  return *v;
}

CpuExecutor cpu_executor() {
  const std::string m = choice("MESHRT_CPU_EXECUTOR", "cpu", {"auto", "threads", "fibers"});
  if (m == "threads") return CpuExecutor::threads;
  if (m == "fibers") return CpuExecutor::fibers;
  return CpuExecutor::automatic;
}

std::string collective_algo() {
  return choice("MESHRT_COLLECTIVE_ALGO", "shard_map",
                {"auto", "direct", "ring", "bidi_ring", "native"});
}

bool deterministic() { return flag("MESHRT_DETERMINISTIC", "shard_map"); }

std::chrono::milliseconds collective_timeout() {
  auto v = raw("MESHRT_COLLECTIVE_TIMEOUT");
  if (!v) return std::chrono::seconds(300);
  char* end = nullptr;
  const double s = std::strtod(v->c_str(), &end);
  if (*end != '\0' || !(s > 0) || s > 1e7) {
    bad("shard_map", "MESHRT_COLLECTIVE_TIMEOUT", *v,
        "a positive number of seconds; e.g. MESHRT_COLLECTIVE_TIMEOUT=60");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

int64_t mpi_max_message_bytes() {
  return integer("MESHRT_MPI_MAX_MESSAGE_BYTES", "distributed", 16, INT32_MAX, kMpiMaxMessageBytes,
                 "a byte count between 16 and 2147483647 (a testing knob: unset it, or e.g. "
                 "MESHRT_MPI_MAX_MESSAGE_BYTES=1000 to split every transfer above 1000 bytes)");
}

int cuda_devices_per_gpu() {
  return static_cast<int>(
      integer("MESHRT_CUDA_DEVICES_PER_GPU", "cuda", 1, kMaxCudaDevicesPerGpu, 1,
              detail::cat("a count between 1 and ", kMaxCudaDevicesPerGpu,
                          "; set it to the number of logical devices per GPU, e.g. 4")));
}

std::optional<size_t> cuda_cache_bytes() {
  if (!raw("MESHRT_CUDA_CACHE_BYTES")) return std::nullopt;
  return static_cast<size_t>(integer("MESHRT_CUDA_CACHE_BYTES", "cuda", 0, INT64_MAX, 0,
                                     "a byte count >= 0, e.g. MESHRT_CUDA_CACHE_BYTES=1073741824"));
}

bool cuda_sync_copies() { return flag("MESHRT_CUDA_SYNC_COPIES", "cuda"); }

bool cuda_fibers() {
  return choice("MESHRT_CUDA_EXECUTOR", "cuda", {"threads", "fibers"}) == "fibers";
}

bool cuda_graphs() { return flag("MESHRT_CUDA_GRAPHS", "cuda"); }

bool cuda_fusion_chains() {
  return choice("MESHRT_CUDA_FUSION", "cuda", {"pairs", "chains"}) == "chains";
}

bool jit_fusion() { return choice("MESHRT_JIT_FUSION", "jit", {"1", "0"}) == "1"; }

bool cuda_matmul_lt() { return choice("MESHRT_CUDA_MATMUL", "cuda", {"cublas", "lt"}) == "lt"; }

bool explicit_sharding() {
  return choice("MESHRT_SHARDING", "sharding", {"auto", "explicit"}) == "explicit";
}

MatmulPlacement matmul_placement() {
  const std::string v = choice("MESHRT_MATMUL_PLACEMENT", "matmul", {"auto", "cheapest", "jax"});
  return v == "cheapest" ? MatmulPlacement::cheapest
         : v == "jax"    ? MatmulPlacement::jax
                         : MatmulPlacement::automatic;
}

bool keep_rows() { return choice("MESHRT_KEEP_ROWS", "matmul", {"1", "0"}) == "1"; }

bool cpu_stream_stores() {
  return choice("MESHRT_CPU_STREAM_STORES", "collectives", {"1", "0"}) == "1";
}

bool log_collectives() { return flag("MESHRT_LOG_COLLECTIVES", "collective_log"); }

bool require_cuda() { return flag("MESHRT_REQUIRE_CUDA", "tests"); }

bool prng_legacy_stream() {
  return choice("MESHRT_PRNG_STREAM", "random.key", {"current", "legacy"}) == "legacy";
}

bool matmul_tf32() {
  return choice("MESHRT_MATMUL_PRECISION", "matmul", {"highest", "tf32"}) == "tf32";
}

std::optional<std::string> plugin_dir() { return raw("MESHRT_PLUGIN_DIR"); }

int launcher_local_processes() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (auto v = raw(name)) {
      char* end = nullptr;
      const long n = std::strtol(v->c_str(), &end, 10);
      if (*end == '\0' && n >= 1 && n <= 1 << 20) return static_cast<int>(n);
    }
  }
  return 1;
}

}  // namespace meshrt::config
