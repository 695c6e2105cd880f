// libFuzzer target: the MESHRT_* variables (core/config). The first byte picks a variable of the
// table, the rest (up to a NUL) is its value; every getter must return or throw meshrt::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/config.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& vars = meshrt::config::variables();
  const std::string name(vars[data[0] % vars.size()].name);
  std::string value(reinterpret_cast<const char*>(data + 1), size - 1);
  value = value.substr(0, value.find('\0'));
  setenv(name.c_str(), value.c_str(), 1);
  const auto call = [](auto getter) {
    try {
      getter();
    } catch (const meshrt::Error&) {  // a clear error is the answer to a bad value
    }
  };
  call(meshrt::config::cpu_devices);
  call(meshrt::config::platform);
  call(meshrt::config::cpu_executor);
  call(meshrt::config::collective_algo);
  call(meshrt::config::deterministic);
  call(meshrt::config::collective_timeout);
  call(meshrt::config::cuda_devices_per_gpu);
  call(meshrt::config::cuda_cache_bytes);
  call(meshrt::config::cuda_sync_copies);
  call(meshrt::config::explicit_sharding);
  call(meshrt::config::log_collectives);
  call(meshrt::config::require_cuda);
  call(meshrt::config::prng_legacy_stream);
  call(meshrt::config::matmul_tf32);
  call(meshrt::config::plugin_dir);
  unsetenv(name.c_str());
  return 0;
}
