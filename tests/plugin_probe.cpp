// A program linked against the core library only: what a user's binary sees when the plugins
// (libmeshrt_cuda.so, libmeshrt_mpi.so) are absent, hidden or broken. Prints the usable platforms,
// why cuda is or is not usable, runs one op on cpu, and reports its resident memory.
//   plugin_probe            (tests/plugins.cmake runs it from a folder holding only the core)
#include <meshrt/meshrt.h>

#include <cstdio>
#include <fstream>
#include <string>

int main() {
  using namespace meshrt;
  std::string list;
  for (const std::string& p : platforms()) list += (list.empty() ? "" : ",") + p;
  std::printf("platforms: %s\n", list.c_str());
  try {
    std::printf("cuda: %zu devices\n", devices("cuda").size());
  } catch (const Error& e) {
    std::printf("cuda: %s\n", e.what());
  }
  const Tensor x = ones({4}, DType::f32, devices("cpu")[0]);
  std::printf("cpu op: %g\n", static_cast<double>(sum(x + x).to_vector<float>()[0]));
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) std::printf("rss: %s\n", line.substr(6).c_str());
  }
  return 0;
}
