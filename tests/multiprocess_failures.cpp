// Failure cases across processes, one per run (tests/CMakeLists.txt runs each under mpirun with 2
// processes x 2 cpu devices and MESHRT_COLLECTIVE_TIMEOUT=3, and matches the output):
//   mismatch  the processes call psum on different shapes: every process reports both calls;
//   skip      process 1 never makes the psum: process 0 reports it within the timeout;
//   die       process 1 is killed before the psum: mpirun ends process 0, which says where it was;
//   size      the processes reshard arrays of different shapes (rows of 1000 floats on process 0,
//             999 on process 1) onto process 0's first device: process 0 reports the transfer
//             whose size differs (split into pieces under MESHRT_MPI_MAX_MESSAGE_BYTES=999: its
//             length; one message: the short message), naming both processes;
//   longer    the same with 1001 floats per row on process 1: one message longer than process 0
//             receives.
// Each process prints the error it got ("process <i>: <error>") and exits with 1.
#include <meshrt/meshrt.h>

#include <csignal>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace meshrt;
  const std::string which = argc > 1 ? argv[1] : "";
  try {
    distributed::initialize();
    Mesh mesh = make_mesh({4}, {"x"});
    // mismatch: 2 elements per device on process 0, 3 on process 1 (device_put needs no message).
    const int64_t per = which == "mismatch" && process_index() == 1 ? 3 : 2;
    std::vector<float> v(static_cast<size_t>(4 * per));
    std::iota(v.begin(), v.end(), 0.f);
    Array x = device_put(v, {4 * per}, NamedSharding(mesh, P("x")));
    if (which == "size" || which == "longer") {
      const int64_t cols = process_index() == 0 ? 1000 : which == "size" ? 999 : 1001;
      std::vector<float> rows(static_cast<size_t>(4 * cols), 1.f);
      Array y = device_put(rows, {4, cols}, NamedSharding(mesh, P("x")));
      device_put(y, SingleDeviceSharding(devices()[0]));
      std::printf("process %d: no error\n", process_index());
      return 0;
    }
    if (which == "skip" && process_index() == 1) return 0;
    if (which == "die" && process_index() == 1) std::raise(SIGKILL);
    Array s = shard_map([](Context& c, const Tensor& t) { return c.psum(t, "x"); }, mesh, {P("x")},
                        P())(x);
    std::printf("process %d: no error\n", process_index());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "process %d: %s\n", process_index(), e.what());
    return 1;
  }
}
