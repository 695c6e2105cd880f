// backends/cuda/graphs.cpp: jit's compiled steps as CUDA graphs (MESHRT_CUDA_GRAPHS=1;
// CudaBackend::run_graph, Backend::run_graph's contract).
//
// A compiled step replays the same kernel calls on every call; only its addresses (operands,
// planned intermediates, fresh results) can change. Launching them one by one costs each a
// launch on the host (a data-parallel step on 8 logical devices launches about 700 from 8
// threads); a graph launches the whole step once per device. Per logical device:
//   * the first time a (step, addresses) pair is met, the step runs as usual and the pair is
//     remembered (addresses that never repeat, results in fresh buffers each call, are never
//     captured);
//   * the second time, the step runs into a capture (cudaStreamCaptureModeThreadLocal: the other
//     logical devices' threads go on launching), nothing executes, and the graph is instantiated
//     and launched on the compute stream;
//   * from then on, the same pair launches the graph (cudaGraphLaunch), with the stream order of
//     the calls it replaces.
// Captures run on the device's own capture stream, one at a time per device (try-locked: a
// thread meeting a step while another captures runs it as usual), with the capturing thread's
// op calls routed there (ops_stream): the compute stream, which other threads (jit calls from
// several threads, small steps on the caller's thread) go on using, is never in capture mode. What
// may not be captured drops the capture and runs the step as usual: an allocation from the
// caching allocator (allocate() marks it: a block baked into a graph would be handed to others
// after the call), a block released to the driver (released after the capture instead), a host
// wait or any call CUDA refuses during a capture (an error, caught), a capture CUDA invalidates,
// or a first launch that fails. Such a step is not captured again. Stream-ordered allocations
// (cudaMallocAsync, the reductions' scratch) become the graph's own memory nodes; cuBLAS gets a
// fixed workspace (ops.cpp) so eager and captured products pick the same algorithm. Up to
// kMaxGraphs graphs per logical device, the least recently launched replaced.
//
// Written on a machine without a GPU and not yet run on one; tests/lazy_devices.h models the
// capture (closures holding their pointers, as a graph's nodes do) and
// JitOnADevicePlatform.ReplaysStepsAsGraphsWhereAddressesRepeat runs jit through it.
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"

namespace meshrt::cuda {

thread_local Capture* t_capture = nullptr;

namespace {

constexpr size_t kMaxGraphs = 64;    // per logical device
constexpr size_t kRemembered = 256;  // (step, addresses) pairs met once, per logical device

uint64_t hash_of(uint64_t key, const void* const* addresses, size_t count) {
  uint64_t h = 1469598103934665603ull ^ key;  // FNV-1a over the key and the addresses
  for (size_t i = 0; i < count; ++i) {
    h ^= static_cast<uint64_t>(reinterpret_cast<uintptr_t>(addresses[i]));
    h *= 1099511628211ull;
  }
  return h ^ count;
}

}  // namespace

struct GraphCache {
  struct Entry {
    uint64_t key = 0;
    std::vector<const void*> addresses;
    cudaGraphExec_t exec = nullptr;
    uint64_t last = 0;
  };
  std::vector<Entry> graphs;
  std::vector<uint64_t> met;  // hashes of pairs met once, a ring of kRemembered
  size_t met_next = 0;
  std::vector<uint64_t> never;  // keys whose capture was dropped
  uint64_t clock = 0;
};

bool CudaBackend::run_graph(int device, uint64_t key, const void* const* addresses, size_t count,
                            backend::BodyRef body) {
  if (!graphs_ || sync_copies_ || t_capture != nullptr) {
    body();
    return false;
  }
  Logical& l = dev(device);
  const uint64_t h = hash_of(key, addresses, count);
  {
    std::unique_lock<std::mutex> lock(l.graphs_mu);
    if (l.graphs == nullptr) l.graphs = std::make_shared<GraphCache>();
    GraphCache& c = *l.graphs;
    for (GraphCache::Entry& e : c.graphs) {
      if (e.key != key || e.addresses.size() != count) continue;
      bool same = true;
      for (size_t i = 0; i < count && same; ++i) same = e.addresses[i] == addresses[i];
      if (!same) continue;
      e.last = ++c.clock;
      set(device);
      MESHRT_CUDA_CHECK(cudaGraphLaunch(e.exec, l.compute), device);
      graph_launches_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    bool met = false, never = false;
    for (uint64_t m : c.met) met = met || m == h;
    for (uint64_t k : c.never) never = never || k == key;
    if (!met || never) {
      if (!met) {
        if (c.met.size() < kRemembered) {
          c.met.push_back(h);
        } else {
          c.met[c.met_next] = h;
          c.met_next = (c.met_next + 1) % kRemembered;
        }
      }
      lock.unlock();
      body();
      return false;
    }
  }
  // The second meeting: capture, one thread at a time per device (another thread meeting a
  // step while this one captures runs it as usual), on the device's capture stream, so work other
  // threads queue on the compute stream meanwhile is neither absorbed into the graph nor
  // disturbed; the graph launches on the compute stream, in its order.
  std::unique_lock<std::mutex> capturing(l.capture_mu, std::try_to_lock);
  if (!capturing.owns_lock()) {
    body();
    return false;
  }
  set(device);
  if (l.capture == nullptr) {
    MESHRT_CUDA_CHECK(cudaStreamCreateWithFlags(&l.capture, cudaStreamNonBlocking), device);
  }
  Capture cap;
  cap.device = device;
  cap.stream = l.capture;
  MESHRT_CUDA_CHECK(cudaStreamBeginCapture(l.capture, cudaStreamCaptureModeThreadLocal), device);
  t_capture = &cap;
  try {
    body();
  } catch (...) {
    cap.ok = false;  // a call CUDA refuses while capturing (or a real error: body runs again)
  }
  t_capture = nullptr;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(l.capture, &graph);
  for (const auto& [d, block] : cap.to_release) release_block(d, block);
  cudaGraphExec_t exec = nullptr;
  if (ended == cudaSuccess && cap.ok && graph != nullptr &&
      cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    exec = nullptr;
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  // The first launch before the graph is kept: one that fails is dropped with it.
  if (exec != nullptr && cudaGraphLaunch(exec, l.compute) != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    exec = nullptr;
  }
  if (exec == nullptr) {
    (void)cudaGetLastError();  // the capture's refusal is not the step's error
    {
      std::lock_guard<std::mutex> lock(l.graphs_mu);
      l.graphs->never.push_back(key);
    }
    body();  // nothing ran while capturing
    return false;
  }
  graph_launches_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(l.graphs_mu);
  GraphCache& c = *l.graphs;
  if (c.graphs.size() >= kMaxGraphs) {
    size_t oldest = 0;
    for (size_t i = 1; i < c.graphs.size(); ++i) {
      if (c.graphs[i].last < c.graphs[oldest].last) oldest = i;
    }
    // A launch still running keeps its resources until it completes (cudaGraphExecDestroy).
    cudaGraphExecDestroy(c.graphs[oldest].exec);
    c.graphs.erase(c.graphs.begin() + static_cast<std::ptrdiff_t>(oldest));
  }
  c.graphs.push_back(GraphCache::Entry{key, std::vector<const void*>(addresses, addresses + count),
                                       exec, ++c.clock});
  return true;
}

}  // namespace meshrt::cuda
