// block_until_ready waits for queued work, on a stand-in for a device platform: the "cuda"
// platform here is LazyDevices, host memory whose op kernels are queued per device and run only
// when something waits for them (synchronize, a copy, freeing memory a kernel uses), like a
// GPU's streams. A block_until_ready that returned at once (the first GPU run's fault: every
// timing measured launches) leaves the kernels queued and these tests fail.
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <atomic>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/detail/platform.h"
#include "tests/lazy_devices.h"

namespace meshrt {
namespace {

using test::LazyDevices;

constexpr int kDevices = 4;

LazyDevices& lazy() {
  static LazyDevices* fake = [] {
    auto b = std::make_unique<LazyDevices>(kDevices);
    LazyDevices* p = b.get();
    detail::install_backend_for_testing(Device::Kind::cuda, std::move(b));
    return p;
  }();
  return *fake;
}

TEST(BlockUntilReady, TensorWaitsForItsQueuedKernels) {
  LazyDevices& fake = lazy();
  const Device d = devices("cuda").at(1);
  Tensor x = tensor(std::vector<float>{1, 2, 3, 4}, {4}, d);  // a copy: nothing queued after it
  ASSERT_EQ(fake.pending(), 0);
  Tensor y = exp(x * x + x);  // three kernels, queued
  EXPECT_GT(fake.pending(), 0) << "the stand-in must queue kernels for this test to mean anything";
  const int syncs = fake.synchronized();
  EXPECT_EQ(&y.block_until_ready(), &y);
  EXPECT_EQ(fake.pending(), 0) << "block_until_ready returned with kernels still queued";
  EXPECT_GT(fake.synchronized(), syncs);
  std::vector<float> v = y.to_vector<float>();
  for (int i = 0; i < 4; ++i) {
    const float xi = static_cast<float>(i + 1);
    EXPECT_FLOAT_EQ(v[static_cast<size_t>(i)], std::exp(xi * xi + xi));
  }
}

TEST(BlockUntilReady, ArrayWaitsOnEveryDeviceOfItsSharding) {
  LazyDevices& fake = lazy();
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  std::vector<float> host(16);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  Array a = device_put(host, {16}, NamedSharding(mesh, P("x")));
  ASSERT_EQ(fake.pending(), 0);
  Array b = a * a - a;  // per-device kernels, queued on all four devices
  EXPECT_GE(fake.pending(), kDevices);
  b.block_until_ready();
  EXPECT_EQ(fake.pending(), 0) << "block_until_ready left queued work on some device";
  std::vector<float> v = b.to_vector<float>();
  for (size_t i = 0; i < host.size(); ++i) EXPECT_EQ(v[i], host[i] * host[i] - host[i]);
}

TEST(BlockUntilReady, ReplicatedArrayWaitsOnEveryCopy) {
  LazyDevices& fake = lazy();
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  Array a = device_put(std::vector<float>{1, 2, 3}, {3}, NamedSharding(mesh, P()));
  Array b = a + a;
  EXPECT_GE(fake.pending(), kDevices);
  b.block_until_ready();
  EXPECT_EQ(fake.pending(), 0);
}

// A resharding's copies between a device platform's devices go to the backend as one batch (cuda
// orders and launches it once), after the kernels that produced the sources.
TEST(BlockUntilReady, ReshardingCopiesGoOutAsOneBatch) {
  LazyDevices& fake = lazy();
  Mesh mesh = make_mesh({kDevices}, {"x"}, "cuda");
  std::vector<float> host(64);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  Array x = device_put(host, {8, 8}, NamedSharding(mesh, P("x")));
  Array y = x * 2.0f;  // kernels queued on every device
  ASSERT_GT(fake.pending(), 0);
  const int batches = fake.batches(), copies = fake.batched_copies();
  Array z = device_put(y, NamedSharding(mesh, P(None, "x")));
  EXPECT_EQ(fake.batches(), batches + 1);
  // Each column block takes a (2, 2) piece from each of the 4 row blocks.
  EXPECT_EQ(fake.batched_copies(), copies + kDevices * kDevices);
  std::vector<float> v = z.to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], 2.0f * host[i]) << i;
}

TEST(BlockUntilReady, FailureOfQueuedWorkSurfacesThere) {
  LazyDevices& fake = lazy();
  const Device d = devices("cuda").at(2);
  Tensor x = tensor(std::vector<float>{1, 2}, {2}, d);
  fake.fail_next_kernel();
  Tensor y = x + x;  // queued: the op itself returns
  try {
    y.block_until_ready();
    FAIL() << "block_until_ready returned although the queued kernel failed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("queued kernel on device 2 failed"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fake.pending(), 0);
}

TEST(BlockUntilReady, EmptyValuesAreErrors) {
  EXPECT_THROW(Tensor().block_until_ready(), Error);
  EXPECT_THROW(Array().block_until_ready(), Error);
}

TEST(BlockUntilReady, CpuReturnsAtOnceWithTheValue) {
  Mesh mesh = make_mesh({2}, {"x"}, "cpu");
  Array a = device_put(std::vector<float>{1, 2, 3, 4}, {4}, NamedSharding(mesh, P("x")));
  Array b = (a + a).block_until_ready();
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{2, 4, 6, 8}));
}

}  // namespace
}  // namespace meshrt
