// 256 simulated cpu devices (one executor thread each): collectives over all of them complete
// and are correct. Run with MESHRT_CPU_DEVICES=256 (set by CTest).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "core/threads/fiber_executor.h"
#include "core/threads/wait.h"
#include "tests/test_util.h"

namespace meshrt {
namespace {

TEST(ManyDevices, PsumOver256Devices) {
  ASSERT_EQ(devices("cpu").size(), 256u);
  Mesh mesh = make_mesh({256}, {"x"});
  std::vector<int64_t> host(256 * 3);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int64_t>(i);
  Array x = device_put(host, {256 * 3}, NamedSharding(mesh, P("x")));
  Array s =
      shard_map([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, mesh, {P("x")}, P())(x);
  std::vector<int64_t> want(3, 0);
  for (size_t i = 0; i < host.size(); ++i) want[i % 3] += host[i];
  EXPECT_EQ(s.to_vector<int64_t>(), want);
}

TEST(ManyDevices, TupleAxesAndGathersOn16x16) {
  Mesh mesh = make_mesh({16, 16}, {"a", "b"});
  std::vector<int32_t> host(256);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int32_t>(i);
  Array x = device_put(host, {16, 16}, NamedSharding(mesh, P("a", "b")));
  auto outs = shard_map(
      [](Context& c, const Tensor& t) {
        Tensor row_sum = c.psum(t, "b");                    // sum over a row of the mesh
        Tensor all = c.all_gather(t, {"b", "a"}, 0, true);  // every element, b-major order
        Tensor total = c.pmax(t, {"a", "b"});
        return std::vector<Tensor>{row_sum, all, total};
      },
      mesh, {P("a", "b")}, {P("a"), P(), P()})(x);
  std::vector<int32_t> rows(16, 0), bmajor, mx{255};
  for (int a = 0; a < 16; ++a) {
    for (int b = 0; b < 16; ++b)
      rows[static_cast<size_t>(a)] += host[static_cast<size_t>(a * 16 + b)];
  }
  for (int b = 0; b < 16; ++b) {
    for (int a = 0; a < 16; ++a) bmajor.push_back(host[static_cast<size_t>(a * 16 + b)]);
  }
  EXPECT_EQ(outs[0].to_vector<int32_t>(), rows);
  // Each device's all_gather result is (256, 1) in group order (b major), i.e. column-major.
  std::vector<int32_t> got = outs[1].to_vector<int32_t>();
  EXPECT_EQ(got, bmajor);
  EXPECT_EQ(outs[2].to_vector<int32_t>(), mx);
}

// A device waiting on a fiber hands its thread to the others for as long as the worker needs to
// run each of its busy devices once (10 us each), before it takes the waiter's slow path: with a
// fixed 100 us, the waiters of a 256-device collective resumed about 1.5 times per call (2048
// devices per worker: 1.7), each resume a switch into a cold stack.
TEST(ManyDevices, FiberWaitBudgetCoversEveryBusyDeviceOfItsWorker) {
  constexpr int kDevices = 256;
  core::FiberPool pool(kDevices, /*workers=*/1);
  std::atomic<uint32_t> go{0};
  std::atomic<int> started{0}, finished{0};
  std::vector<std::chrono::nanoseconds> budget(kDevices);
  for (int d = 0; d < kDevices; ++d) {
    pool.submit(d, [&, d] {
      // Every device waits (busy) until the last has started: all 256 share the worker then.
      if (started.fetch_add(1) + 1 == kDevices) {
        go.store(1);
        core::wake_all(go);
      } else {
        core::sleep_while(go, 0, std::chrono::seconds(60));
      }
      budget[static_cast<size_t>(d)] = core::cooperative_wait_budget(core::kSpinBudget);
      finished.fetch_add(1);
    });
  }
  while (finished.load() < kDevices) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The last device to start saw all 256 busy; the last to end, itself alone.
  EXPECT_EQ(*std::max_element(budget.begin(), budget.end()),
            kDevices * core::kCooperativeWaitPerFiber);
  EXPECT_EQ(*std::min_element(budget.begin(), budget.end()),
            std::chrono::nanoseconds(core::kSpinBudget));
  // Off a fiber (this thread): the budget as given.
  EXPECT_EQ(core::cooperative_wait_budget(core::kSpinBudget),
            std::chrono::nanoseconds(core::kSpinBudget));
}

}  // namespace
}  // namespace meshrt
