// The collectives' device-plane protocol, checked on cpu: the same algorithms the cuda platform
// runs (direct, ring, bidi_ring; deterministic or not) driven through a backend whose collective
// primitives behave like GPU streams. Every copy, fold and fill a member queues is only
// executed when that member fences, or when a peer waits on a token the member recorded after
// it, so an algorithm that tells a peer or the host "ready" without a fence or token reads
// stale memory here and its result — read the moment its collective returns, as the next
// kernel would — differs from the host-memory run of the same collective (bit for bit). Also
// checked: every waited token was recorded, every token is recycled, every member enters with
// coll_begin and leaves with a fence.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "backends/backend.h"
#include "backends/cpu/coll_primitives.h"
#include "backends/native_comm.h"
#include "collectives/collective.h"
#include "collectives/groups.h"
#include "collectives/reduce.h"
#include "collectives/rendezvous.h"
#include "core/error.h"
#include "tests/fake_device_backend.h"

namespace meshrt {
namespace {

using coll::Algo;
using coll::Kind;

class LazyStreams final : public test::CollectivesOnlyBackend {
 public:
  using Transfer = backend::NativeComm::Transfer;
  explicit LazyStreams(int n) : streams_(static_cast<size_t>(n)), native_(*this) {}

  std::string_view platform() const override { return "lazy-streams"; }
  int device_count() const override { return static_cast<int>(streams_.size()); }
  std::shared_ptr<backend::Buffer> allocate(int, size_t) override { throw Error("not used"); }
  void deallocate(int, void*, size_t) noexcept override {}

  void coll_begin(int device) override { ++stream(device).begins; }
  void coll_copy_2d(int device, void* dst, size_t dpitch, const void* src, size_t spitch,
                    size_t width, size_t height) override {
    enqueue(device, [=] {
      for (size_t r = 0; r < height; ++r) {
        std::memcpy(static_cast<char*>(dst) + r * dpitch,
                    static_cast<const char*>(src) + r * spitch, width);
      }
    });
  }
  void coll_zero(int device, void* dst, size_t bytes) override {
    enqueue(device, [=] { std::memset(dst, 0, bytes); });
  }
  void coll_fold(int device, backend::FoldOp op, DType in, DType out, void* dst,
                 const std::vector<const void*>& srcs, int64_t len) override {
    enqueue(device, [=] { cpu::fold(op, in, out, dst, srcs, len); });
  }
  void coll_mean(int device, DType in, DType out, void* dst, const void* sum, int64_t len,
                 int64_t divisor) override {
    enqueue(device, [=] { cpu::mean_from_sum(in, out, dst, sum, len, divisor); });
  }
  void coll_fence(int device) override {
    // Late, as a busy GPU would be: widens the window in which a protocol that skipped a fence
    // lets a peer read what is not there yet.
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    flush(device, UINT64_MAX);
    ++stream(device).fences;
  }
  struct Token {
    int device;
    uint64_t seq;
    bool begin = false;  // from coll_begin_token
  };
  // The stand-in has no compute stream: the token marks the member's stream as it is now.
  void* coll_begin_token(int device) override {
    Stream& s = stream(device);
    std::lock_guard<std::mutex> lock(s.mu);
    ++live_tokens_;
    ++s.begin_tokens;
    return new Token{device, s.next, true};
  }
  void* coll_signal(int device) override {
    Stream& s = stream(device);
    std::lock_guard<std::mutex> lock(s.mu);
    ++live_tokens_;
    return new Token{device, s.next};
  }
  void coll_wait_token(int, void* token) override {
    if (token == nullptr) {
      ++missing_tokens_;
      return;
    }
    const auto* t = static_cast<Token*>(token);
    if (t->begin) ++begin_waits_;
    flush(t->device, t->seq);  // everything the peer queued before recording it
  }
  void coll_release_token(int, void* token) noexcept override {
    delete static_cast<Token*>(token);
    --live_tokens_;
  }
  // The member's later work waits for the token: here, the token's work runs now (the stand-in
  // has no compute stream; what the member does next sees its results, as on a GPU).
  void coll_order_compute(int device, void* token) override {
    ++stream(device).compute_orders;
    coll_wait_token(device, token);
  }

  backend::NativeComm* native_comm() override { return &native_; }
  // Groups whose members must not use direct or ring (as GPUs without peer access).
  std::string direct_unavailable(const std::vector<int>& group) override {
    return group == no_direct_ ? "no peer access between dev:0 and dev:1 (stand-in)" : "";
  }
  void refuse_direct(std::vector<int> group) { no_direct_ = std::move(group); }

  int begins(int d) { return stream(d).begins; }
  int begin_tokens(int d) { return stream(d).begin_tokens; }
  int begin_waits() const { return begin_waits_; }
  int fences(int d) { return stream(d).fences; }
  int compute_orders(int d) { return stream(d).compute_orders; }
  int live_tokens() const { return live_tokens_; }
  int64_t queued() const { return queued_; }
  int missing_tokens() const { return missing_tokens_; }
  size_t pending(int d) {
    std::lock_guard<std::mutex> lock(stream(d).mu);
    return stream(d).queue.size();
  }

 private:
  struct Entry {
    const void* in;
    void* out;
    std::vector<Transfer> sends, recvs;
  };
  struct Round {
    explicit Round(size_t n) : entries(n) {}
    std::vector<Entry> entries;  // written before `launched` counts them
    std::atomic<size_t> launched{0};
  };
  void launch(int device, const std::vector<int>& group, Entry entry,
              std::function<void(const Round&, size_t)> body) {
    flush(device, UINT64_MAX);  // NCCL's kernel runs after what the stream already holds
    std::shared_ptr<Round> r;
    const size_t me =
        static_cast<size_t>(std::find(group.begin(), group.end(), device) - group.begin());
    {
      std::lock_guard<std::mutex> lock(native_mu_);
      const int64_t seq = next_round_[{group, device}]++;
      auto& slot = rounds_[{group, seq}];
      if (!slot) slot = std::make_shared<Round>(group.size());
      r = slot;
      r->entries[me] = std::move(entry);
    }
    r->launched.fetch_add(1);
    enqueue(device, [r, me, body] {
      while (r->launched.load() < r->entries.size())
        std::this_thread::yield();  // every rank launched
      body(*r, me);
    });
  }
  std::mutex native_mu_;
  std::map<std::pair<std::vector<int>, int64_t>, std::shared_ptr<Round>>
      rounds_;                                                      // guarded by native_mu_
  std::map<std::pair<std::vector<int>, int>, int64_t> next_round_;  // guarded by native_mu_

  struct Stream {
    std::mutex mu;
    std::deque<std::pair<uint64_t, std::function<void()>>> queue;  // guarded by mu
    uint64_t next = 0;                                             // guarded by mu
    std::atomic<int> begins{0}, fences{0}, compute_orders{0}, begin_tokens{0};
  };
  Stream& stream(int d) { return streams_[static_cast<size_t>(d)]; }
  void enqueue(int d, std::function<void()> f) {
    ++queued_;
    Stream& s = stream(d);
    std::lock_guard<std::mutex> lock(s.mu);
    s.queue.emplace_back(s.next++, std::move(f));
  }
  // Runs the device's queued work with sequence numbers below `upto`, in order.
  void flush(int d, uint64_t upto) {
    Stream& s = stream(d);
    std::lock_guard<std::mutex> lock(s.mu);
    while (!s.queue.empty() && s.queue.front().first < upto) {
      auto f = std::move(s.queue.front().second);
      s.queue.pop_front();
      f();
    }
  }
  std::vector<Stream> streams_;
  std::atomic<int> live_tokens_{0}, missing_tokens_{0}, begin_waits_{0};
  std::atomic<int64_t> queued_{0};

  // ---- a stand-in for NCCL: a member's launch is ordered after its queued work (flushed then);
  // its output is written by an op on its own stream once every member has launched, from the
  // members' inputs in group order (direct's fold order, so results compare bit for bit).
  class Native final : public backend::NativeComm {
   public:
    explicit Native(LazyStreams& s) : s_(s) {}
    std::string_view name() const override { return "stand-in"; }
    std::string unavailable(const std::vector<int>&) override { return ""; }
    // Groups within one process only (tests/test_multiprocess_native.cpp has the spanning ones).
    bool spanning_open(const backend::CommGroup&) override { return false; }
    std::string new_token() override { throw Error("not used"); }
    void open_spanning(const backend::CommGroup&, int, const std::string&) override {
      throw Error("not used");
    }
    void all_reduce(int device, const backend::CommGroup& group, backend::FoldOp op, DType dtype,
                    const void* in, void* out, int64_t count) override {
      s_.launch(device, group.devices, {in, out, {}, {}}, [=](const Round& r, size_t) {
        std::vector<const void*> srcs;
        for (const Entry& e : r.entries) srcs.push_back(e.in);
        cpu::fold(op, dtype, dtype, out, srcs, count);
      });
    }
    void all_gather(int device, const backend::CommGroup& group, const void* in, void* out,
                    int64_t bytes) override {
      s_.launch(device, group.devices, {in, out, {}, {}}, [=](const Round& r, size_t) {
        for (size_t j = 0; j < r.entries.size(); ++j) {
          std::memcpy(static_cast<char*>(out) + static_cast<int64_t>(j) * bytes, r.entries[j].in,
                      static_cast<size_t>(bytes));
        }
      });
    }
    void reduce_scatter(int device, const backend::CommGroup& group, DType dtype, const void* in,
                        void* out, int64_t count) override {
      s_.launch(device, group.devices, {in, out, {}, {}}, [=](const Round& r, size_t me) {
        std::vector<const void*> srcs;
        for (const Entry& e : r.entries) {
          srcs.push_back(static_cast<const char*>(e.in) +
                         static_cast<int64_t>(me) * count *
                             static_cast<int64_t>(dtype_size(dtype)));
        }
        cpu::fold(backend::FoldOp::sum, dtype, dtype, out, srcs, count);
      });
    }
    void send_recv(int device, const backend::CommGroup& group, const std::vector<Transfer>& sends,
                   const std::vector<Transfer>& recvs) override {
      s_.launch(device, group.devices, {nullptr, nullptr, sends, recvs},
                [=](const Round& r, size_t me) {
                  for (const Transfer& rv : recvs) {
                    bool found = false;
                    for (const Transfer& sd : r.entries[static_cast<size_t>(rv.peer)].sends) {
                      if (sd.peer != static_cast<int64_t>(me)) continue;
                      EXPECT_EQ(sd.bytes, rv.bytes);
                      std::memcpy(rv.data, sd.data, static_cast<size_t>(rv.bytes));
                      found = true;
                    }
                    EXPECT_TRUE(found) << "a receive with no matching send";
                  }
                });
    }

   private:
    LazyStreams& s_;
  };
  Native native_;
  std::vector<int> no_direct_;
};

using Case = test::CollectiveCase;
using test::out_shape_of;

// The cpu backend's host-memory primitives: the reference every lazy-stream run must match.
backend::Backend* host_memory() {
  static backend::Backend* cpu = backend::make_cpu_backend(4).release();  // leaked: executors
  return cpu;
}

struct Outcome {
  std::vector<std::vector<char>> out;  // per member, read the moment its collective returned
  std::vector<std::string> errors;     // per member, "" when it succeeded
};

// One collective over `n` members: its call, its rendezvous, and every member's buffers (random
// inputs, fixed seed; outputs and work buffers filled with garbage).
struct Group {
  Group(const Case& c, Algo algo, bool det, int64_t n) : n(n), session(names(n), kTimeout, false) {
    layout = coll::make_group_layout({n}, {0});
    layout.axis_names = {"x"};
    call = test::call_of(c, algo, det, layout.axis_names, n);
    const DType od = c.kind == Kind::pmean ? coll::pmean_dtype(c.dtype) : c.dtype;
    out_shape = out_shape_of(c, n);
    int64_t in_elems = 1, out_elems = 1;
    for (int64_t d : c.shape) in_elems *= d;
    for (int64_t d : out_shape) out_elems *= d;
    in.resize(static_cast<size_t>(n));
    out.resize(static_cast<size_t>(n));
    work.resize(static_cast<size_t>(n));
    std::mt19937 rng(7);
    for (auto& b : in) {
      b.resize(static_cast<size_t>(in_elems) * dtype_size(c.dtype));
      for (size_t e = 0; e < b.size() / dtype_size(c.dtype); ++e) {
        const double v = static_cast<double>(static_cast<int>(rng() % 2001) - 1000) /
                         (c.dtype == DType::f32 ? 7.0 : 1.0);
        if (c.dtype == DType::f32) {
          const float f = static_cast<float>(v);
          std::memcpy(b.data() + e * 4, &f, 4);
        } else {
          const int32_t i = static_cast<int32_t>(v);
          std::memcpy(b.data() + e * 4, &i, 4);
        }
      }
    }
    for (auto& b : out) b.assign(static_cast<size_t>(out_elems) * dtype_size(od), '\x5a');
    work_bytes = coll::work_bytes(call, n);
    for (auto& b : work) b.assign(static_cast<size_t>(std::max<int64_t>(work_bytes, 1)), '\x5a');
  }

  // Member `pos` joins the collective through `be` (host memory, or the lazy streams).
  coll::Pending start(int64_t pos, backend::Backend* be) {
    coll::Slot slot;
    slot.backend = be;
    slot.device = static_cast<int>(pos);
    slot.in = in[static_cast<size_t>(pos)].data();
    slot.out = out[static_cast<size_t>(pos)].data();
    if (work_bytes > 0) slot.work = work[static_cast<size_t>(pos)].data();
    return coll::start(session, pos, layout, call, std::move(slot), out_shape);
  }

  static std::vector<std::string> names(int64_t n) {
    std::vector<std::string> v;
    for (int64_t i = 0; i < n; ++i) v.push_back("dev:" + std::to_string(i));
    return v;
  }
  static constexpr std::chrono::seconds kTimeout{20};

  int64_t n;
  coll::GroupLayout layout;
  coll::Session session;
  coll::Call call;
  Shape out_shape;
  std::vector<std::vector<char>> in, out, work;
  int64_t work_bytes = 0;
};

// Runs one collective over `n` members (one thread each) through `be` (host memory, or the lazy
// streams).
Outcome run_members(const Case& c, Algo algo, bool det, int64_t n, backend::Backend* be) {
  Group g(c, algo, det, n);
  std::vector<std::vector<char>> result(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int64_t pos = 0; pos < n; ++pos) {
    threads.emplace_back([&, pos] {
      try {
        coll::Pending p = g.start(pos, be);
        coll::finish(p);
        result[static_cast<size_t>(pos)] =
            g.out[static_cast<size_t>(pos)];  // read at once, as the next kernel would
        g.session.device_finished(pos, false);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(pos)] = e.what();
        g.session.device_finished(pos, true);
      }
    });
  }
  for (auto& t : threads) t.join();
  return {std::move(result), std::move(errors)};
}

std::vector<std::vector<char>> run(const Case& c, Algo algo, bool det, int64_t n,
                                   backend::Backend* be) {
  Outcome o = run_members(c, algo, det, n, be);
  for (const std::string& e : o.errors) EXPECT_EQ(e, "");
  return std::move(o.out);
}

TEST(DevicePlane, EveryAlgorithmMatchesHostMemoryBitForBit) {
  const int64_t n = 4;
  // Small (one-shot by the last arriver) and large (sliced, two-phase) reductions, layouts that
  // need staging, a member receiving nothing.
  const std::vector<Case> cases = {
      {Kind::psum, DType::f32, {37}},
      {Kind::psum, DType::f32, {96, 128}},  // 48 KiB: the large path
      {Kind::pmean, DType::f32, {64, 130}},
      {Kind::pmean, DType::i32, {5, 9}},
      {Kind::pmean, DType::i32, {64, 140}},
      {Kind::pmax, DType::f32, {100, 90}},
      {Kind::pmin, DType::i32, {13}},
      {Kind::all_gather, DType::f32, {6, 5}, 0, 0, true},
      {Kind::all_gather, DType::f32, {6, 5}, 1, 0, true},
      {Kind::all_gather, DType::i32, {6, 5}, 1, 0, false},
      {Kind::psum_scatter, DType::f32, {8, 6}, 0, 0, true},
      {Kind::psum_scatter, DType::f32, {6, 8}, 1, 0, true},
      {Kind::psum_scatter, DType::i32, {3, 4, 5}, 1, 0, false},
      {Kind::ppermute, DType::f32, {7, 3}},
      {Kind::all_to_all, DType::f32, {8, 6}, 0, 1, true},
      {Kind::all_to_all, DType::i32, {3, 4, 2}, 1, 0, false},
  };
  LazyStreams fake(static_cast<int>(n));
  int collectives = 0;
  for (const Case& c : cases) {
    for (Algo algo : {Algo::direct, Algo::ring, Algo::bidi_ring}) {
      for (bool det : {false, true}) {
        const auto host = run(c, algo, det, n, host_memory());
        const auto dev = run(c, algo, det, n, &fake);
        ++collectives;
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_EQ(dev[static_cast<size_t>(i)], host[static_cast<size_t>(i)])
              << coll::kind_name(c.kind) << " " << coll::algo_name(algo)
              << (det ? " deterministic" : "") << " member " << i;
          EXPECT_EQ(fake.pending(static_cast<int>(i)), 0u)
              << "work left queued after the collective returned";
        }
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(fake.begins(i) + fake.begin_tokens(i), collectives)
        << "a member joined without waiting for its earlier work";
    // Every small direct reduction (those above and pmean of 5x9 i32, whose f32 output ends in
    // a fence: 3 cases x 2 determinism settings) joins without a host wait: a begin token each.
    EXPECT_EQ(fake.begin_tokens(i), 6) << "member " << i;
    EXPECT_GE(fake.fences(i) + fake.compute_orders(i), collectives)
        << "a member left without fencing its stream or ordering its later work after it";
    // The small direct reductions (psum of 37, pmin of 13: 2 cases x 2 determinism settings)
    // end without a host wait: every member orders its later work after the completer's token.
    EXPECT_EQ(fake.compute_orders(i), 4) << "member " << i;
  }
  // The member that folds a small reduction waits on every member's begin token first.
  EXPECT_EQ(fake.begin_waits(), 6 * n);
  EXPECT_EQ(fake.missing_tokens(), 0) << "a member waited on a token that was never recorded";
  EXPECT_EQ(fake.live_tokens(), 0) << "tokens were not recycled";

  // native (the NCCL path: staging, placement, pmean's divide, zeros for a member that receives
  // nothing, the all_to_all exchange) against the host's direct algorithm.
  for (const Case& c : cases) {
    for (bool det : {false, true}) {
      const auto host = run(c, Algo::direct, det, n, host_memory());
      const auto dev = run(c, Algo::native, det, n, &fake);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(dev[static_cast<size_t>(i)], host[static_cast<size_t>(i)])
            << coll::kind_name(c.kind) << " native" << (det ? " deterministic" : "") << " member "
            << i;
      }
    }
  }
}

// Members whose devices cannot reach each other's memory (GPUs without peer access) never run
// direct or ring: every member gets the reason before anything is queued (the small direct
// reduction, done by the last arriver inside start(), included), and native still serves them.
TEST(DevicePlane, GroupsWithoutPeerAccessRefuseDirectAndRing) {
  const int64_t n = 4;
  LazyStreams fake(static_cast<int>(n));
  fake.refuse_direct({0, 1, 2, 3});
  const std::vector<Case> cases = {
      {Kind::psum, DType::f32, {37}},       // small: the last arriver's one-shot path
      {Kind::psum, DType::f32, {96, 128}},  // large: sliced
      {Kind::all_gather, DType::f32, {6, 5}, 1, 0, true},
      {Kind::ppermute, DType::f32, {7, 3}},
  };
  for (const Case& c : cases) {
    for (Algo algo : {Algo::direct, Algo::ring, Algo::bidi_ring}) {
      const int64_t before = fake.queued();
      const Outcome o = run_members(c, algo, false, n, &fake);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NE(o.errors[static_cast<size_t>(i)].find(
                      "] algo " + std::string(coll::algo_name(algo)) +
                      " cannot serve this group: no peer access between dev:0 and dev:1"),
                  std::string::npos)
            << coll::kind_name(c.kind) << " member " << i << ": "
            << o.errors[static_cast<size_t>(i)];
      }
      EXPECT_EQ(fake.queued(), before) << "work was queued on a group that cannot run it";
    }
    const auto host = run(c, Algo::direct, false, n, host_memory());
    const auto dev = run(c, Algo::native, false, n, &fake);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(dev[static_cast<size_t>(i)], host[static_cast<size_t>(i)]) << "native member " << i;
  }
}

// A member whose collective fails midway (a peer threw out of its body after joining) leaves
// finish() with its stream fenced, as on success: the blocks the instance keeps alive are recycled
// once the last member lets go of it, and nothing queued may still write into them then. A native
// library call that a peer never joined cannot be fenced; the error still comes at once.
TEST(DevicePlane, FailedCollectiveFencesItsStreamBeforeItsBlocksAreRecycled) {
  const std::vector<Case> cases = {
      {Kind::psum, DType::f32, {96, 128}},
      {Kind::pmean, DType::i32, {5, 9}},
      {Kind::all_gather, DType::f32, {6, 5}, 1, 0, true},
      {Kind::psum_scatter, DType::f32, {8, 6}, 0, 0, true},
  };
  for (const Case& c : cases) {
    for (Algo algo : {Algo::ring, Algo::bidi_ring, Algo::native}) {
      for (bool det : {false, true}) {
        const std::string what = std::string(coll::kind_name(c.kind)) + " " +
                                 std::string(coll::algo_name(algo)) + (det ? " deterministic" : "");
        LazyStreams fake(2);
        Group g(c, algo, det, 2);
        std::string error;
        size_t queued = 0;
        std::thread stays([&] {
          coll::Pending p = g.start(0, &fake);
          try {
            coll::finish(p);
          } catch (const Error& e) {
            error = e.what();
            queued = fake.pending(0);  // while the Pending still holds the instance
          }
          g.session.device_finished(0, !error.empty());
        });
        std::thread leaves([&] {
          coll::Pending p = g.start(1, &fake);
          g.session.device_finished(1, true);
        });
        stays.join();
        leaves.join();
        EXPECT_NE(error.find("dev:1"), std::string::npos)
            << what << ": the error should name the member that left: " << error;
        if (algo != Algo::native)
          EXPECT_EQ(queued, 0u) << what << ": work left queued on a failed member's stream";
      }
    }
  }
}

}  // namespace
}  // namespace meshrt
