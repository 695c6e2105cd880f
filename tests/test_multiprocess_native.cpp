// The cuda platform's path across processes (collectives/cross.h), checked on cpu under mpirun
// with 2 processes x 2 devices: a backend whose memory counts as device memory (not host
// addressable, so a group spanning processes takes the library path) and a stand-in for NCCL
// whose communicators span processes, moving data over the job's ProcessComm. Checked: every
// collective kind is routed to the library, whatever algorithm the call named, and matches a
// one-process run of the host's direct algorithm bit for bit; the library's token is made once,
// by the process holding member 0, and every process opens the group once, with the same bytes;
// a call the processes disagree on, and a group the library refuses on one process, are errors
// on every process before the library is entered.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "backends/backend.h"
#include "backends/cpu/coll_primitives.h"
#include "backends/native_comm.h"
#include "backends/process_comm.h"
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
using Transfer = backend::NativeComm::Transfer;

backend::ProcessComm& job() { return *backend::process_comm(); }
backend::ProcessComm::Deadline soon() {
  return std::chrono::steady_clock::now() + std::chrono::seconds(60);
}

// Every process's `mine`, in rank order.
std::vector<std::string> everyones(const std::string& mine, int tag) {
  std::vector<std::string> out;
  EXPECT_TRUE(job().exchange({0, 1}, tag, mine, out, soon(), "the test's exchange").empty());
  return out;
}

// The stand-in's exchanges (one collective at a time) and the test's own, apart from the tags
// the collectives layer uses (small: one mesh axis).
constexpr int kDataTag = 30000;
constexpr int kTestTag = 30001;

// ---- a stand-in for NCCL across processes: a call returns once every member of the group, in
// every process, has made it; its output is computed from every member's input in group order
// (direct's fold order, so results compare bit for bit).
class SpanningNative final : public backend::NativeComm {
 public:
  std::string_view name() const override { return "stand-in"; }
  std::string unavailable(const std::vector<int>&) override { return refuse; }
  bool spanning_open(const backend::CommGroup& g) override {
    std::lock_guard<std::mutex> lock(mu_);
    return opened_.count(g) != 0;
  }
  std::string new_token() override {
    return "token of process " + std::to_string(job().rank()) + " #" +
           std::to_string(++tokens_made);
  }
  void open_spanning(const backend::CommGroup& g, int me, const std::string& token) override {
    EXPECT_EQ(me, job().rank());
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(opened_.count(g), 0u) << "a group opened twice";
    opened_[g] = token;
    last_token = token;
    ++opens;
  }

  void all_reduce(int device, const backend::CommGroup& g, backend::FoldOp op, DType dtype,
                  const void* in, void* out, int64_t count) override {
    const auto bytes = static_cast<size_t>(count) * dtype_size(dtype);
    round(device, g, std::string(static_cast<const char*>(in), bytes),
          [&](const std::vector<std::string>& all, size_t) {
            std::vector<const void*> srcs;
            for (const std::string& b : all) srcs.push_back(b.data());
            cpu::fold(op, dtype, dtype, out, srcs, count);
          });
  }
  void all_gather(int device, const backend::CommGroup& g, const void* in, void* out,
                  int64_t bytes) override {
    round(device, g, std::string(static_cast<const char*>(in), static_cast<size_t>(bytes)),
          [&](const std::vector<std::string>& all, size_t) {
            for (size_t j = 0; j < all.size(); ++j)
              std::memcpy(static_cast<char*>(out) + j * static_cast<size_t>(bytes), all[j].data(),
                          static_cast<size_t>(bytes));
          });
  }
  void reduce_scatter(int device, const backend::CommGroup& g, DType dtype, const void* in,
                      void* out, int64_t count) override {
    const size_t chunk = static_cast<size_t>(count) * dtype_size(dtype);
    round(device, g, std::string(static_cast<const char*>(in), chunk * g.devices.size()),
          [&](const std::vector<std::string>& all, size_t rank) {
            std::vector<const void*> srcs;
            for (const std::string& b : all) srcs.push_back(b.data() + rank * chunk);
            cpu::fold(backend::FoldOp::sum, dtype, dtype, out, srcs, count);
          });
  }
  void send_recv(int device, const backend::CommGroup& g, const std::vector<Transfer>& sends,
                 const std::vector<Transfer>& recvs) override {
    std::string blob;  // per send: peer, bytes, data
    for (const Transfer& t : sends) {
      blob.append(reinterpret_cast<const char*>(&t.peer), sizeof t.peer);
      blob.append(reinterpret_cast<const char*>(&t.bytes), sizeof t.bytes);
      blob.append(static_cast<const char*>(t.data), static_cast<size_t>(t.bytes));
    }
    round(device, g, blob, [&](const std::vector<std::string>& all, size_t rank) {
      for (const Transfer& rv : recvs) {
        bool found = false;
        const std::string& from = all[static_cast<size_t>(rv.peer)];
        for (size_t at = 0; at < from.size();) {
          int64_t peer = 0, bytes = 0;
          std::memcpy(&peer, from.data() + at, sizeof peer);
          std::memcpy(&bytes, from.data() + at + sizeof peer, sizeof bytes);
          at += sizeof peer + sizeof bytes;
          if (peer == static_cast<int64_t>(rank)) {
            EXPECT_EQ(bytes, rv.bytes);
            std::memcpy(rv.data, from.data() + at, static_cast<size_t>(rv.bytes));
            found = true;
          }
          at += static_cast<size_t>(bytes);
        }
        EXPECT_TRUE(found) << "a receive with no matching send";
      }
    });
  }

  std::string refuse;  // unavailable()'s answer
  std::atomic<int> tokens_made{0}, opens{0}, calls{0};
  std::string last_token;  // guarded by mu_ while members run

 private:
  // Each local member posts its blob; the last to post exchanges the process's blobs with the
  // other processes; then every member computes its output from all members' blobs.
  void round(int device, const backend::CommGroup& g, std::string blob,
             const std::function<void(const std::vector<std::string>&, size_t)>& body) {
    if (!g.spans()) throw Error("[stand-in] serves groups spanning processes only");
    const int me = job().rank();
    size_t rank = 0, local = 0;
    for (size_t k = 0; k < g.devices.size(); ++k) {
      if (g.processes[k] != me) continue;
      ++local;
      if (g.devices[k] == device) rank = k;
    }
    std::vector<int> procs = g.processes;
    std::sort(procs.begin(), procs.end());
    procs.erase(std::unique(procs.begin(), procs.end()), procs.end());
    std::unique_lock<std::mutex> lock(mu_);
    if (opened_.count(g) == 0) throw Error("[stand-in] called before the group was opened");
    ++calls;
    mine_[rank] = std::move(blob);
    const int64_t gen = gen_;
    if (mine_.size() == local) {
      std::string packed;
      for (const auto& [r, b] : mine_) {
        const uint64_t n = b.size();
        packed.append(reinterpret_cast<const char*>(&n), sizeof n);
        packed += b;
      }
      mine_.clear();
      lock.unlock();
      std::vector<std::string> theirs;
      const bool ok =
          job().exchange(procs, kDataTag, packed, theirs, soon(), "the stand-in").empty();
      lock.lock();
      EXPECT_TRUE(ok) << "the stand-in's exchange timed out";
      all_.assign(g.devices.size(), std::string());
      for (size_t p = 0; p < procs.size(); ++p) {
        size_t at = 0;
        for (size_t k = 0; k < g.devices.size(); ++k) {
          if (g.processes[k] != procs[p] || at >= theirs[p].size()) continue;
          uint64_t n = 0;
          std::memcpy(&n, theirs[p].data() + at, sizeof n);
          all_[k] = theirs[p].substr(at + sizeof n, n);
          at += sizeof n + n;
        }
      }
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
    const std::vector<std::string> all = all_;
    lock.unlock();
    body(all, rank);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<backend::CommGroup, std::string> opened_;  // guarded by mu_
  std::map<size_t, std::string> mine_;                // guarded by mu_
  std::vector<std::string> all_;                      // guarded by mu_
  int64_t gen_ = 0;                                   // guarded by mu_
};

// Two devices whose collective primitives complete at once, on memory the collectives layer must
// treat as a device's (host_addressable() is false).
class FakeDevices final : public test::CollectivesOnlyBackend {
 public:
  std::string_view platform() const override { return "fake-gpu"; }
  int device_count() const override { return 2; }
  std::shared_ptr<backend::Buffer> allocate(int device, size_t bytes) override {
    ++allocations;
    return std::make_shared<backend::Buffer>(this, device, std::malloc(std::max<size_t>(bytes, 1)),
                                             bytes);
  }
  void deallocate(int, void* data, size_t) noexcept override { std::free(data); }

  void coll_begin(int) override {}
  void coll_copy_2d(int, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t height) override {
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                  width);
    }
  }
  void coll_zero(int, void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void coll_fold(int, backend::FoldOp op, DType in, DType out, void* dst,
                 const std::vector<const void*>& srcs, int64_t len) override {
    cpu::fold(op, in, out, dst, srcs, len);
  }
  void coll_mean(int, DType in, DType out, void* dst, const void* sum, int64_t len,
                 int64_t divisor) override {
    cpu::mean_from_sum(in, out, dst, sum, len, divisor);
  }
  void coll_fence(int) override {}
  void* coll_signal(int) override { return this; }
  void coll_wait_token(int, void*) override {}
  void coll_release_token(int, void*) noexcept override {}
  backend::NativeComm* native_comm() override { return &native; }

  SpanningNative native;
  std::atomic<int> allocations{0};
};

using Case = test::CollectiveCase;
using test::out_shape_of;

constexpr int64_t kMembers = 4;

struct Outcome {
  std::vector<std::vector<char>> out;  // per member of this process ("" elsewhere)
  std::vector<std::string> errors;     // per member of this process, "" when it succeeded
};

// One collective over kMembers members, one thread per member of this process, through `be`.
// `process_of`: each member's process (every member in this one when empty); a member's device
// is its index among its process's members. Inputs: random integers (fixed seed), the same bytes
// on every process.
Outcome run(const Case& c, Algo algo, bool det, backend::Backend* be,
            const std::vector<int>& process_of) {
  static int launches = 0;  // every process runs the same collectives in the same order
  std::shared_ptr<coll::CrossProcess> cross;
  if (!process_of.empty()) {
    cross = std::make_shared<coll::CrossProcess>();
    cross->comm = &job();
    cross->process_of = process_of;
    cross->rank = job().rank();
    cross->launch = "collective #" + std::to_string(++launches);
  }
  std::vector<std::string> names;
  for (int64_t i = 0; i < kMembers; ++i) names.push_back("dev:" + std::to_string(i));
  coll::Session session(names, std::chrono::seconds(30), false, cross);
  coll::GroupLayout layout = coll::make_group_layout({kMembers}, {0});
  layout.axis_names = {"x"};
  const coll::Call call = test::call_of(c, algo, det, layout.axis_names, kMembers);
  const Shape out_shape = out_shape_of(c, kMembers);
  int64_t in_elems = 1, out_elems = 1;
  for (int64_t d : c.shape) in_elems *= d;
  for (int64_t d : out_shape) out_elems *= d;
  const DType od = c.kind == Kind::pmean ? coll::pmean_dtype(c.dtype) : c.dtype;
  std::vector<std::vector<char>> in(kMembers), out(kMembers), work(kMembers);
  std::mt19937 rng(7);
  for (auto& b : in) {
    b.resize(static_cast<size_t>(in_elems) * 4);
    for (size_t e = 0; e < b.size() / 4; ++e) {
      const int v = static_cast<int>(rng() % 2001) - 1000;
      if (c.dtype == DType::f32) {
        const float f = static_cast<float>(v) / 7.f;
        std::memcpy(b.data() + e * 4, &f, 4);
      } else {
        std::memcpy(b.data() + e * 4, &v, 4);
      }
    }
  }
  const int64_t wb = coll::work_bytes(call, kMembers);  // as the runtime sizes it
  Outcome o{std::vector<std::vector<char>>(kMembers), std::vector<std::string>(kMembers)};
  std::vector<std::thread> threads;
  int next_device = 0;
  for (int64_t pos = 0; pos < kMembers; ++pos) {
    const auto p = static_cast<size_t>(pos);
    if (!process_of.empty() && process_of[p] != job().rank()) continue;  // another process's
    out[p].assign(static_cast<size_t>(out_elems) * dtype_size(od), '\x5a');
    work[p].assign(static_cast<size_t>(std::max<int64_t>(wb, 1)), '\x5a');
    const int device = process_of.empty() ? static_cast<int>(pos) : next_device++;
    threads.emplace_back([&, pos, p, device] {
      try {
        coll::Slot slot;
        slot.backend = be;
        slot.device = device;
        slot.in = in[p].data();
        slot.out = out[p].data();
        if (wb > 0) slot.work = work[p].data();
        coll::Pending pending = coll::start(session, pos, layout, call, std::move(slot), out_shape);
        coll::finish(pending);
        o.out[p] = out[p];
        session.device_finished(pos, false);
      } catch (const std::exception& e) {
        o.errors[p] = e.what();
        session.device_finished(pos, true);
      }
    });
  }
  for (auto& t : threads) t.join();
  return o;
}

// The reference: the host's direct algorithm, every member in this process.
Outcome reference(const Case& c, bool det) {
  static backend::Backend* cpu = backend::make_cpu_backend(kMembers).release();  // leaked
  return run(c, Algo::direct, det, cpu, {});
}

FakeDevices& fake() {
  static auto* f = new FakeDevices();  // leaked: spanning communicators live as long as the job
  return *f;
}

TEST(MultiprocessNative, EveryCollectiveMatchesOneProcessBitForBit) {
  ASSERT_EQ(job().size(), 2) << "run under mpirun -np 2";
  const std::vector<Case> cases = {
      {Kind::psum, DType::f32, {37}},
      {Kind::psum, DType::f32, {96, 128}},  // above the small-reduction size
      {Kind::pmean, DType::f32, {64, 130}},
      {Kind::pmean, DType::i32, {5, 9}},
      {Kind::pmax, DType::f32, {100, 90}},
      {Kind::pmin, DType::i32, {13}},
      {Kind::all_gather, DType::f32, {6, 5}, 0, 0, true},
      {Kind::all_gather, DType::i32, {6, 5}, 1, 0, false},
      {Kind::psum_scatter, DType::f32, {8, 6}, 0, 0, true},
      {Kind::psum_scatter, DType::i32, {3, 4, 5}, 1, 0, false},
      {Kind::ppermute, DType::f32, {7, 3}},
      {Kind::all_to_all, DType::f32, {8, 6}, 0, 1, true},
      {Kind::all_to_all, DType::i32, {3, 4, 2}, 1, 0, false},
  };
  const std::vector<int> process_of = {0, 0, 1, 1};
  for (const Case& c : cases) {
    // direct: what the runtime sets up on cuda when it does not pick native; routed anyway.
    for (Algo algo : {Algo::native, Algo::direct}) {
      for (bool det : {false, true}) {
        const std::string what = std::string(coll::kind_name(c.kind)) + " " +
                                 std::string(coll::algo_name(algo)) + (det ? " deterministic" : "");
        const int calls = fake().native.calls.load();
        const Outcome want = reference(c, det);
        const Outcome got = run(c, algo, det, &fake(), process_of);
        for (size_t p = 0; p < kMembers; ++p) {
          if (process_of[p] != job().rank()) continue;
          EXPECT_EQ(got.errors[p], "") << what;
          EXPECT_EQ(got.out[p], want.out[p]) << what << " member " << p;
        }
        EXPECT_EQ(fake().native.calls.load(), calls + 2) << what << ": not run by the library";
      }
    }
  }
  EXPECT_EQ(fake().native.opens.load(), 1) << "one group, opened once";
  EXPECT_EQ(fake().native.tokens_made.load(), job().rank() == 0 ? 1 : 0);
  const std::vector<std::string> tokens = everyones(fake().native.last_token, kTestTag);
  EXPECT_EQ(tokens[0], "token of process 0 #1");
  EXPECT_EQ(tokens[1], tokens[0]);
  EXPECT_GT(fake().allocations.load(), 0) << "calls set up for direct got no work buffers";
}

TEST(MultiprocessNative, TheProcessOfMemberZeroMakesTheToken) {
  ASSERT_EQ(job().size(), 2);
  const Case c{Kind::psum, DType::i32, {10}};
  const std::vector<int> process_of = {1, 1, 0, 0};
  const int made = fake().native.tokens_made.load();
  const Outcome want = reference(c, false);
  const Outcome got = run(c, Algo::native, false, &fake(), process_of);
  for (size_t p = 0; p < kMembers; ++p) {
    if (process_of[p] != job().rank()) continue;
    EXPECT_EQ(got.errors[p], "");
    EXPECT_EQ(got.out[p], want.out[p]) << "member " << p;
  }
  EXPECT_EQ(fake().native.tokens_made.load(), made + (job().rank() == 1 ? 1 : 0));
  EXPECT_EQ(fake().native.opens.load(), 2);
  const std::vector<std::string> tokens = everyones(fake().native.last_token, kTestTag);
  EXPECT_EQ(tokens[0], "token of process 1 #1");
  EXPECT_EQ(tokens[1], tokens[0]);
}

TEST(MultiprocessNative, DisagreementIsAnErrorBeforeTheLibrary) {
  ASSERT_EQ(job().size(), 2);
  const Case c{Kind::psum, DType::f32, {job().rank() == 0 ? int64_t{4} : int64_t{5}}};
  const std::vector<int> process_of = {0, 1, 0, 1};  // a group not opened yet
  const int calls = fake().native.calls.load(), opens = fake().native.opens.load();
  const int made = fake().native.tokens_made.load();
  const Outcome got = run(c, Algo::native, false, &fake(), process_of);
  for (size_t p = 0; p < kMembers; ++p) {
    if (process_of[p] != job().rank()) continue;
    EXPECT_NE(got.errors[p].find("[psum] processes disagree on a collective across processes"),
              std::string::npos)
        << got.errors[p];
    EXPECT_NE(got.errors[p].find("psum(float32[5]"), std::string::npos) << got.errors[p];
  }
  EXPECT_EQ(fake().native.calls.load(), calls);
  EXPECT_EQ(fake().native.opens.load(), opens);
  EXPECT_EQ(fake().native.tokens_made.load(), made);
}

TEST(MultiprocessNative, AGroupTheLibraryRefusesIsAnErrorOnEveryProcess) {
  ASSERT_EQ(job().size(), 2);
  const Case c{Kind::all_gather, DType::f32, {3}, 0, 0, true};
  const std::vector<int> process_of = {0, 1, 0, 1};
  if (job().rank() == 1) fake().native.refuse = "dev:0 and dev:1 share a GPU (stand-in)";
  const int calls = fake().native.calls.load(), opens = fake().native.opens.load();
  const Outcome got = run(c, Algo::native, false, &fake(), process_of);
  for (size_t p = 0; p < kMembers; ++p) {
    if (process_of[p] != job().rank()) continue;
    EXPECT_NE(got.errors[p].find("stand-in cannot serve this group across processes (process 1: "
                                 "dev:0 and dev:1 share a GPU (stand-in))"),
              std::string::npos)
        << got.errors[p];
    EXPECT_NE(got.errors[p].find("MESHRT_CUDA_DEVICES_PER_GPU=1"), std::string::npos)
        << got.errors[p];
  }
  EXPECT_EQ(fake().native.calls.load(), calls);
  EXPECT_EQ(fake().native.opens.load(), opens);
  fake().native.refuse.clear();
}

}  // namespace
}  // namespace meshrt

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  meshrt::backend::set_process_comm(meshrt::backend::make_mpi_comm(std::chrono::seconds(60)));
  return RUN_ALL_TESTS();
}
