// The library tests/plugin_fake.cpp's first build needs; tests/plugins.cmake hides it.
extern "C" int meshrt_fake_dep_value() { return 0; }
