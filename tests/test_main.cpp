// GoogleTest main for meshrt's suites. `--meshrt-env=NAME=VALUE` sets an environment variable
// before any test runs (CTest passes the cpu executor and the cuda settings this way: its
// ENVIRONMENT lists do not survive gtest_discover_tests).
//
// Suites run on the default platform, which the tests pin: MESHRT_PLATFORM=cpu unless the run
// asks for cuda (the cuda_k<k>. CTest entries: MESHRT_PLATFORM=cuda and
// MESHRT_CUDA_DEVICES_PER_GPU=k). A cuda run on a machine where cuda is not usable, or has fewer
// logical devices than MESHRT_TEST_MIN_DEVICES, runs no test: it prints why and exits with 77,
// which CTest reports as skipped. With MESHRT_REQUIRE_CUDA=1 (GPU CI) an unusable platform is a
// failure instead (exit 1); too few logical devices for a suite stays a skip.
#include <gtest/gtest.h>
#include <meshrt/meshrt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/config.h"

namespace {

struct Unusable {
  std::string why;      // "" when the suite can run
  bool failed = false;  // the platform itself failed (not merely too few devices)
};

// Why the pinned platform cannot run this suite here.
Unusable platform_unusable() {
  const std::string platform = std::getenv("MESHRT_PLATFORM");
  if (platform == "cpu") return {};
  try {
    const size_t have = meshrt::devices(platform).size();
    const char* min = std::getenv("MESHRT_TEST_MIN_DEVICES");
    const size_t need = min != nullptr ? static_cast<size_t>(std::atoi(min)) : 1;
    if (have < need) {
      return {"this suite needs " + std::to_string(need) + " " + platform +
              " devices and the platform has " + std::to_string(have) +
              " (raise MESHRT_CUDA_DEVICES_PER_GPU)"};
    }
  } catch (const meshrt::Error& e) {
    return {std::string("platform ") + platform + " is not usable on this machine: " + e.what(),
            true};
  }
  return {};
}

// CTest's SKIP_RETURN_CODE for the cuda_k<k>. runs.
constexpr int kSkipped = 77;

}  // namespace

int main(int argc, char** argv) {
  const char* flag = "--meshrt-env=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], flag, std::strlen(flag)) != 0) continue;
    std::string kv = argv[i] + std::strlen(flag);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  setenv("MESHRT_PLATFORM", "cpu", 0);  // keep an explicit choice
  ::testing::InitGoogleTest(&argc, argv);
  if (!GTEST_FLAG_GET(list_tests)) {
    bool required = false;
    try {
      required = meshrt::config::require_cuda();
    } catch (const meshrt::Error& e) {
      std::printf("[  FAILED  ] %s\n", e.what());
      return 1;
    }
    if (const Unusable u = platform_unusable(); !u.why.empty()) {
      if (u.failed && required) {
        std::printf("[  FAILED  ] %s (MESHRT_REQUIRE_CUDA=1: a failure, not a skip)\n",
                    u.why.c_str());
        return 1;
      }
      std::printf("[  SKIPPED ] %s\n", u.why.c_str());
      return kSkipped;
    }
  }
  return RUN_ALL_TESTS();
}
