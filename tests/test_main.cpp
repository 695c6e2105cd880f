// GoogleTest main for meshrt's suites. `--meshrt-env=NAME=VALUE` sets an environment variable
// before any test runs (CTest passes the cpu executor this way: its ENVIRONMENT lists do not
// survive gtest_discover_tests).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  const char* flag = "--meshrt-env=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], flag, std::strlen(flag)) != 0) continue;
    std::string kv = argv[i] + std::strlen(flag);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
