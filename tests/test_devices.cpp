// The platform registry. Device counts are fixed per process, so each case runs in a fresh
// child process (gtest death tests, "threadsafe" style re-executes the binary).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <unordered_set>

#include "tests/test_util.h"

namespace meshrt {
namespace {

class Devices : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Runs `body` in a child process with MESHRT_CPU_DEVICES set to `env` (nullptr = unset);
// the child exits 0 when body returns true.
template <class F>
void in_child(const char* env, F body) {
  EXPECT_EXIT(
      {
        if (env)
          setenv("MESHRT_CPU_DEVICES", env, 1);
        else
          unsetenv("MESHRT_CPU_DEVICES");
        bool ok = false;
        try {
          ok = body();
        } catch (const std::exception& e) {
          fprintf(stderr, "unexpected exception: %s\n", e.what());
        }
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

bool error_contains(const std::function<void()>& f, const std::string& frag) {
  try {
    f();
  } catch (const Error& e) {
    if (std::string(e.what()).find(frag) != std::string::npos) return true;
    fprintf(stderr, "message was: %s\n", e.what());
    return false;
  }
  fprintf(stderr, "no error thrown\n");
  return false;
}

TEST_F(Devices, DefaultIsOneCpuDevice) {
  in_child(nullptr, [] {
    auto d = devices("cpu");
    return d.size() == 1 && d[0].id() == 0 && d[0].str() == "cpu:0" && d[0].platform() == "cpu";
  });
}

TEST_F(Devices, EnvironmentSetsCount) {
  in_child("8", [] {
    auto d = devices("cpu");
    bool ok = d.size() == 8;
    for (int i = 0; i < 8; ++i) ok &= d[i].id() == i && d[i].local_index() == i;
    return ok && d[7].str() == "cpu:7";
  });
}

TEST_F(Devices, SetCountBeforeFirstUseWinsOverEnvironment) {
  in_child("8", [] {
    set_cpu_device_count(3);
    set_cpu_device_count(4);  // still before first use: the last call counts
    return devices("cpu").size() == 4;
  });
}

TEST_F(Devices, SetCountAfterFirstUseIsAnError) {
  in_child("2", [] {
    devices("cpu");
    set_cpu_device_count(2);  // same count: harmless
    return error_contains([] { set_cpu_device_count(8); },
                          "[devices] set_cpu_device_count(8) called after the cpu platform was "
                          "initialised with 2 device(s)") &&
           devices("cpu").size() == 2;
  });
}

TEST_F(Devices, BadCounts) {
  in_child(nullptr, [] {
    return error_contains([] { set_cpu_device_count(0); }, "the count must be between 1") &&
           error_contains([] { set_cpu_device_count(-3); }, "set_cpu_device_count(-3)") &&
           devices("cpu").size() == 1;  // nothing half-done
  });
  in_child("eight", [] {
    return error_contains([] { devices("cpu"); },
                          "MESHRT_CPU_DEVICES='eight' is not a device count");
  });
  in_child("0", [] { return error_contains([] { devices("cpu"); }, "MESHRT_CPU_DEVICES='0'"); });
}

TEST_F(Devices, PlatformsAndUnknownPlatform) {
  in_child("4", [] {
    auto p = platforms();
    bool ok = !p.empty() && p[0] == "cpu";
    ok &= error_contains([] { devices("tpu"); }, "[devices] unknown platform 'tpu'");
    if (p.size() == 1) {  // no usable GPU here: cuda says why
      ok &= error_contains([] { devices("cuda"); },
                           "[devices] the cuda platform has no usable devices");
      ok &= default_platform() == "cpu" && devices().size() == 4;
    }
    return ok;
  });
}

// devices() hands out the runtime's own vector, the same storage on every call (a contract of
// the public API), so iterators from two calls delimit one range.
TEST_F(Devices, DevicesIsOneStableVector) {
  in_child("4", [] {
    const std::vector<Device>& first = devices("cpu");
    auto begin = devices("cpu").begin();
    auto end = devices("cpu").end();
    bool ok = &first == &devices("cpu") && first.size() == 4;
    ok &= &devices() == &devices(default_platform());  // "" names the same storage
    ok &= begin == first.begin() && end == first.end() && std::distance(begin, end) == 4;
    int i = 0;
    for (auto it = begin; it != end; ++it) ok &= it->id() == i++;
    return ok && i == 4;
  });
}

// An explicit set_cpu_device_count(n) makes cpu the default platform even where a GPU is usable
// (code written for simulated devices keeps running there); MESHRT_PLATFORM still wins.
TEST_F(Devices, SetCountMakesCpuTheDefaultPlatform) {
  in_child("4", [] {
    unsetenv("MESHRT_PLATFORM");
    set_cpu_device_count(4);
    const bool cpu_default = default_platform() == "cpu" && devices().size() == 4 &&
                             devices()[0].platform() == "cpu" &&
                             make_mesh({4}, {"x"}).devices()[0].platform() == "cpu";
    setenv("MESHRT_PLATFORM", "cuda", 1);
    return cpu_default && default_platform() == "cuda";
  });
  in_child("4", [] {
    unsetenv("MESHRT_PLATFORM");
    devices("cpu");
    set_cpu_device_count(4);  // after first use, with the same count: still an explicit choice
    return default_platform() == "cpu";
  });
}

TEST_F(Devices, DeviceValueType) {
  in_child("4", [] {
    auto d = devices("cpu");
    std::unordered_set<Device> set(d.begin(), d.end());
    Device copy = d[2];
    return set.size() == 4 && copy == d[2] && d[1] < d[2] && !(d[1] == d[2]) &&
           Device().str() == "<no device>";
  });
}

}  // namespace
}  // namespace meshrt
