// tests/lazy_devices.h: a stand-in for a device platform, installed as "cuda" in a test binary
// (detail::install_backend_for_testing): host memory whose op kernels are queued per device and
// run only when something waits for them (synchronize, a copy, freeing memory a kernel uses), as
// on a GPU's streams; host_addressable() is false, so the runtime takes its device-platform paths.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "core/error.h"

namespace meshrt::test {

using backend::BinaryOp;
using backend::ReduceOp;
using backend::Strided;
using backend::UnaryOp;

class LazyDevices final : public backend::Backend {
 public:
  explicit LazyDevices(int n)
      : Backend(/*host_memory=*/false),
        inner_(backend::make_cpu_backend(n)),
        queues_(static_cast<size_t>(n)),
        freed_(static_cast<size_t>(n)),
        run_mu_(static_cast<size_t>(n)) {}

  std::string_view platform() const override { return "cuda"; }
  int device_count() const override { return inner_->device_count(); }
  std::string unavailable_reason() const override { return ""; }

  // Kernels queued and not yet run, over every device.
  int pending() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (auto& q : queues_) n += q.size();
    return static_cast<int>(n);
  }
  int ran() const { return ran_.load(); }
  int synchronized() const { return syncs_.load(); }
  // The next kernel queued fails when it runs (as a GPU kernel's fault surfaces later).
  void fail_next_kernel() { fail_next_ = true; }

  std::shared_ptr<backend::Buffer> allocate(int device, size_t bytes) override {
    if (capture_ != nullptr) capture_ok_ = false;  // as cuda's: a capture may not allocate
    std::shared_ptr<backend::Buffer> inner = inner_->allocate(device, bytes);
    void* data = inner->data();
    // The outer Buffer frees through deallocate below; the inner one lives as long as it.
    std::lock_guard<std::mutex> lock(mu_);
    held_.emplace_back(data, std::move(inner));
    return std::make_shared<backend::Buffer>(this, device, data, bytes);
  }
  void deallocate(int device, void* data, size_t) noexcept override {
    // A queued kernel may still use the memory: it is released once the device's queue drains
    // (as a stream-ordered allocator reuses memory only after the work queued before the free).
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (it->first == data) {
        freed_[static_cast<size_t>(device)].push_back(std::move(it->second));
        held_.erase(it);
        return;
      }
    }
  }
  void copy_2d(void* dst, int dst_device, size_t dpitch, const void* src, int src_device,
               size_t spitch, size_t width, size_t height) override {
    if (capture_ != nullptr) {
      if (dst_device == src_device && dst_device != backend::kHost) {  // captured as a graph node
        capture_->push_back([=, this] {
          inner_->copy_2d(dst, dst_device, dpitch, src, src_device, spitch, width, height);
        });
        return;
      }
      capture_ok_ = false;  // a host copy waits: not capturable
    }
    // A copy orders itself after the devices' queued kernels, as the cuda platform's does.
    if (dst_device != backend::kHost) run_queue(dst_device);
    if (src_device != backend::kHost) run_queue(src_device);
    inner_->copy_2d(dst, dst_device, dpitch, src, src_device, spitch, width, height);
  }
  // Whether jit fuses elementwise pairs here (the backend's defaults then run each fused call as
  // its two kernels, queued as any other).
  void set_fuses_pairs(bool on) { fuses_ = on; }
  bool fuses_pairs() const override { return fuses_; }
  // Whether jit fuses products with their bias add and relu here (the backend's default then
  // runs the product and the add, queued as any other).
  void set_fuses_matmul_bias(bool on) { fuses_matmul_bias_ = on; }
  bool fuses_matmul_bias() const override { return fuses_matmul_bias_; }
  // matmul_bias calls so far, and those of them with relu (each runs the default: the product,
  // then the bias add and relu, queued as any other kernels).
  void matmul_bias(int device, DType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                   bool trans_a, const void* b, bool trans_b, Precision precision, const void* bias,
                   bool relu, void* y) override {
    ++matmul_bias_calls_;
    if (relu) ++matmul_bias_relu_calls_;
    Backend::matmul_bias(device, dtype, m, n, k, a, trans_a, b, trans_b, precision, bias, relu, y);
  }
  // Whether jit fuses products with relu's gradient here (the backend's default then runs each
  // fused call as the product, then compare_select), and the matmul_drelu calls so far.
  void set_fuses_matmul_drelu(bool on) { fuses_matmul_drelu_ = on; }
  bool fuses_matmul_drelu() const override { return fuses_matmul_drelu_; }
  void matmul_drelu(int device, DType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                    bool trans_a, const void* b, bool trans_b, Precision precision,
                    const void* relu_out, void* y) override {
    ++matmul_drelu_calls_;
    Backend::matmul_drelu(device, dtype, m, n, k, a, trans_a, b, trans_b, precision, relu_out, y);
  }
  int matmul_drelu_calls() const { return matmul_drelu_calls_.load(); }
  int matmul_bias_calls() const { return matmul_bias_calls_.load(); }
  int matmul_bias_relu_calls() const { return matmul_bias_relu_calls_.load(); }
  // Work graphs, as CUDA graphs (MESHRT_CUDA_GRAPHS=1): with set_graphs(true), run_graph
  // captures body's kernels (closures holding their arguments, pointers included, as queued)
  // the second time a key comes with the same addresses, queuing nothing; that call and every
  // later one with the key and addresses queue the captured kernels without calling body. A
  // capture during which body allocates or copies with the host is dropped (body then runs as
  // usual). A program that passed an incomplete address set would replay stale pointers.
  void set_graphs(bool on) { graphs_ = on; }
  int64_t graph_launches() const override { return graph_launches_.load(); }
  int graph_captures() const { return graph_captures_.load(); }
  bool run_graph(int device, uint64_t key, const void* const* addresses, size_t count,
                 backend::BodyRef body) override {
    if (!graphs_) {
      body();
      return false;
    }
    GraphKey gk{device, key, std::vector<const void*>(addresses, addresses + count)};
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto it = graphs_map_.find(gk);
      if (it != graphs_map_.end()) {
        for (const auto& k : it->second) queues_[static_cast<size_t>(device)].push_back({k, false});
        ++graph_launches_;
        return true;
      }
      if (seen_.insert(gk).second) {  // first sighting: run as usual
        lock.unlock();
        body();
        return false;
      }
    }
    std::vector<std::function<void()>> captured;
    capture_ = &captured;
    capture_ok_ = true;
    try {
      body();
    } catch (...) {
      capture_ = nullptr;
      throw;
    }
    capture_ = nullptr;
    if (!capture_ok_) {
      body();
      return false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& k : captured) queues_[static_cast<size_t>(device)].push_back({k, false});
    graphs_map_.emplace(std::move(gk), std::move(captured));
    ++graph_captures_;
    ++graph_launches_;
    return true;
  }
  // Counts the batches (a resharding's copies between devices), then copies one by one.
  void copy_2d_batch(const std::vector<backend::DeviceCopy>& copies) override {
    ++batches_;
    batched_copies_ += static_cast<int>(copies.size());
    Backend::copy_2d_batch(copies);
  }
  int batches() const { return batches_.load(); }
  int batched_copies() const { return batched_copies_.load(); }
  void submit(int device, std::function<void()> task) override {
    inner_->submit(device, std::move(task));
  }
  void synchronize(int device) override {
    ++syncs_;
    run_queue(device);
  }

  void unary(int device, UnaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
             const Strided& x, void* y) override {
    queue(device, [=, this] { inner_->unary(device, op, in, out, shape, x, y); });
  }
  void binary(int device, BinaryOp op, DType in, DType out, const std::vector<int64_t>& shape,
              const Strided& a, const Strided& b, void* y) override {
    queue(device, [=, this] { inner_->binary(device, op, in, out, shape, a, b, y); });
  }
  void select(int device, DType dtype, const std::vector<int64_t>& shape, const Strided& cond,
              const Strided& a, const Strided& b, void* y) override {
    queue(device, [=, this] { inner_->select(device, dtype, shape, cond, a, b, y); });
  }
  void reduce(int device, ReduceOp op, DType dtype, int64_t outer, int64_t len, int64_t inner,
              const void* x, void* y) override {
    queue(device, [=, this] { inner_->reduce(device, op, dtype, outer, len, inner, x, y); });
  }
  void matmul(int device, DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
              const void* a, const void* b, void* c) override {
    queue(device, [=, this] { inner_->matmul(device, dtype, batch, m, n, k, a, b, c); });
  }
  void fill(int device, DType dtype, int64_t n, double value, bool iota, void* y) override {
    queue(device, [=, this] { inner_->fill(device, dtype, n, value, iota, y); });
  }

  // Collective primitives: host memory underneath, so each runs at once. coll_begin runs the
  // device's queued kernels first (its input is complete before a peer reads it, as the cuda
  // platform's wait on its compute stream makes it); nothing is left to fence.
  void coll_begin(int device) override { run_queue(device); }
  void coll_copy_2d(int device, void* dst, size_t dpitch, const void* src, size_t spitch,
                    size_t width, size_t height) override {
    inner_->coll_copy_2d(device, dst, dpitch, src, spitch, width, height);
  }
  void coll_zero(int device, void* dst, size_t bytes) override {
    inner_->coll_zero(device, dst, bytes);
  }
  void coll_fold(int device, backend::FoldOp op, DType in, DType out, void* dst,
                 const std::vector<const void*>& srcs, int64_t len) override {
    ++folds_;
    inner_->coll_fold(device, op, in, out, dst, srcs, len);
  }
  void coll_mean(int device, DType in, DType out, void* dst, const void* sum, int64_t len,
                 int64_t divisor) override {
    inner_->coll_mean(device, in, out, dst, sum, len, divisor);
  }
  void coll_fence(int) override {}
  void* coll_signal(int) override { return this; }
  void coll_wait_token(int, void*) override {}
  // Collective folds so far (a direct psum folds once per member's slice, or once when small).
  int folds() const { return folds_.load(); }

 private:
  struct Kernel {
    std::function<void()> run;
    bool fails = false;
  };
  void queue(int device, std::function<void()> k) {
    if (capture_ != nullptr) {  // captured into a graph: not run now
      capture_->push_back(std::move(k));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    queues_[static_cast<size_t>(device)].push_back({std::move(k), fail_next_.exchange(false)});
  }
  void run_queue(int device) {
    // One drain per device at a time, as a stream runs its kernels in order: a second thread
    // waiting for the same device waits for the first one's drain.
    std::lock_guard<std::mutex> running(run_mu_[static_cast<size_t>(device)]);
    std::string error;
    for (;;) {
      Kernel k;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto& q = queues_[static_cast<size_t>(device)];
        if (q.empty()) break;
        k = std::move(q.front());
        q.pop_front();
      }
      if (k.fails) {
        error = "[lazy] a queued kernel on device " + std::to_string(device) + " failed";
        continue;
      }
      k.run();
      ++ran_;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      freed_[static_cast<size_t>(device)].clear();
    }
    if (!error.empty()) throw Error(error);
  }

  std::unique_ptr<backend::Backend> inner_;
  std::mutex mu_;
  std::vector<std::deque<Kernel>> queues_;                                // guarded by mu_
  std::vector<std::pair<void*, std::shared_ptr<backend::Buffer>>> held_;  // guarded by mu_
  std::vector<std::vector<std::shared_ptr<backend::Buffer>>> freed_;      // guarded by mu_
  std::vector<std::mutex> run_mu_;  // per device: held while run_queue drains its queue
  std::atomic<int> ran_{0}, syncs_{0}, folds_{0}, batches_{0}, batched_copies_{0};
  std::atomic<bool> fail_next_{false};
  std::atomic<bool> fuses_{false};
  std::atomic<bool> fuses_matmul_bias_{false}, fuses_matmul_drelu_{false};
  std::atomic<int> matmul_bias_calls_{0}, matmul_bias_relu_calls_{0}, matmul_drelu_calls_{0};
  struct GraphKey {
    int device;
    uint64_t key;
    std::vector<const void*> addresses;
    bool operator<(const GraphKey& o) const {
      return std::tie(device, key, addresses) < std::tie(o.device, o.key, o.addresses);
    }
  };
  std::atomic<bool> graphs_{false};
  std::map<GraphKey, std::vector<std::function<void()>>> graphs_map_;  // guarded by mu_
  std::set<GraphKey> seen_;                                            // guarded by mu_
  std::atomic<int64_t> graph_launches_{0};
  std::atomic<int> graph_captures_{0};
  // The capture the calling thread is in (run_graph), or null.
  static inline thread_local std::vector<std::function<void()>>* capture_ = nullptr;
  static inline thread_local bool capture_ok_ = true;
};

}  // namespace meshrt::test
