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
//   * the second time, the compute stream is captured (cudaStreamCaptureModeThreadLocal: the
//     other logical devices' threads go on launching) while the step runs, nothing executes, and
//     the graph is instantiated and launched on the compute stream;
//   * from then on, the same pair launches the graph (cudaGraphLaunch), with the stream order of
//     the calls it replaces.
// What may not be captured drops the capture and runs the step as usual: an allocation from the
// caching allocator (allocate() marks it: a block baked into a graph would be handed to others
// after the call), a host wait or any call CUDA refuses during a capture (an error, caught), or
// a capture CUDA invalidates. Such a step is not captured again. Stream-ordered allocations
// (cudaMallocAsync, the reductions' scratch) become the graph's own memory nodes. Up to
// kMaxGraphs graphs per logical device, the least recently launched replaced (after a wait for
// the device's compute stream, since a launch of it may still run).
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
                            const std::function<void()>& body) {
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
  // The second meeting: capture (outside graphs_mu: the step takes other locks).
  set(device);
  Capture cap;
  MESHRT_CUDA_CHECK(cudaStreamBeginCapture(l.compute, cudaStreamCaptureModeThreadLocal), device);
  t_capture = &cap;
  try {
    body();
  } catch (...) {
    cap.ok = false;  // a call CUDA refuses while capturing (or a real error: body runs again)
  }
  t_capture = nullptr;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(l.compute, &graph);
  cudaGraphExec_t exec = nullptr;
  if (ended == cudaSuccess && cap.ok && graph != nullptr &&
      cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    exec = nullptr;
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (exec == nullptr) {
    (void)cudaGetLastError();  // the capture's refusal is not the step's error
    {
      std::lock_guard<std::mutex> lock(l.graphs_mu);
      l.graphs->never.push_back(key);
    }
    body();  // nothing ran while capturing
    return false;
  }
  std::lock_guard<std::mutex> lock(l.graphs_mu);
  GraphCache& c = *l.graphs;
  if (c.graphs.size() >= kMaxGraphs) {
    size_t oldest = 0;
    for (size_t i = 1; i < c.graphs.size(); ++i) {
      if (c.graphs[i].last < c.graphs[oldest].last) oldest = i;
    }
    sync(device, l.compute);  // a launch of it may still run
    cudaGraphExecDestroy(c.graphs[oldest].exec);
    c.graphs.erase(c.graphs.begin() + static_cast<std::ptrdiff_t>(oldest));
  }
  c.graphs.push_back(GraphCache::Entry{key, std::vector<const void*>(addresses, addresses + count),
                                       exec, ++c.clock});
  MESHRT_CUDA_CHECK(cudaGraphLaunch(exec, l.compute), device);
  return true;
}

}  // namespace meshrt::cuda
