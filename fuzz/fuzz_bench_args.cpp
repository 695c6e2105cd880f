// libFuzzer target: meshrt-bench's command line (bench/bench_args). The input, split at NUL bytes,
// is argv after the program name; parse_args must return or throw meshrt::Error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_args.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"meshrt-bench"};
  std::string arg;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\0') {
      args.push_back(arg);
      arg.clear();
    } else {
      arg.push_back(static_cast<char>(data[i]));
    }
  }
  if (!arg.empty()) args.push_back(arg);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    (void)meshrt::bench::parse_args(static_cast<int>(argv.size()), argv.data());
  } catch (const meshrt::Error&) {  // a clear error is the answer to a bad argument
  }
  return 0;
}
