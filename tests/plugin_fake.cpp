// A stand-in for a plugin (tests/plugins.cmake): built once needing a library that the test then
// hides, and once claiming another plugin ABI. The core must refuse both and say why.
extern "C" int meshrt_fake_dep_value();

extern "C" int meshrt_plugin_abi() {
#ifdef MESHRT_FAKE_NEEDS_DEP
  return meshrt_fake_dep_value();
#else
  return 999;
#endif
}
extern "C" void* meshrt_cuda_backend() { return nullptr; }
