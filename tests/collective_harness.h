// tests/collective_harness.h: runs a body with a distinct input block per device and checks every
// device's output block against the host model (tests/host_ref.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tests/host_ref.h"
#include "tests/test_util.h"

namespace meshrt::test {

struct MeshCase {
  std::string platform;
  Shape shape;
  std::vector<std::string> names;
  std::string algo = "direct";  // MESHRT_COLLECTIVE_ALGO for the case
};

inline std::string mesh_case_name(const ::testing::TestParamInfo<MeshCase>& info) {
  std::string s = info.param.platform + "_" + info.param.algo;
  for (int64_t d : info.param.shape) s += "_" + std::to_string(d);
  return s;
}

inline int cuda_devices_per_gpu() {
  const char* k = std::getenv("MESHRT_CUDA_DEVICES_PER_GPU");
  return k != nullptr && *k != '\0' ? std::atoi(k) : 1;
}

// The mesh for a case, or why this platform cannot run it here (the test then skips).
inline std::optional<Mesh> mesh_or_skip(const MeshCase& c, std::string* why) {
  auto ps = platforms();
  if (std::find(ps.begin(), ps.end(), c.platform) == ps.end()) {
    *why = "platform " + c.platform + " is not usable on this machine";
    return std::nullopt;
  }
  if (numel(c.shape) > static_cast<int64_t>(devices(c.platform).size())) {
    *why = "needs more " + c.platform +
           " devices than this machine has (cuda: raise MESHRT_CUDA_DEVICES_PER_GPU)";
    return std::nullopt;
  }
  if (c.platform == "cuda" && c.algo == "native" && numel(c.shape) > 1 &&
      cuda_devices_per_gpu() > 1) {
    *why =
        "NCCL cannot place two ranks on one GPU (MESHRT_CUDA_DEVICES_PER_GPU > 1); "
        "CudaNative.SharedGpuSaysSo "
        "checks the error";
    return std::nullopt;
  }
  return make_mesh(c.shape, c.names, c.platform);
}
#define MESHRT_MESH_OR_SKIP(var, param)                             \
  std::string var##_why;                                            \
  auto var##_opt = ::meshrt::test::mesh_or_skip(param, &var##_why); \
  if (!var##_opt) GTEST_SKIP() << var##_why;                        \
  const Mesh& var = *var##_opt

// Device p's input: p*1000 + e, sign alternating, exact in every dtype.
inline HostArr device_input(int64_t p, const Shape& block) {
  HostArr a = make_arr(block);
  for (size_t e = 0; e < a.v.size(); ++e)
    a.v[e] = static_cast<double>(p * 1000 + static_cast<int64_t>(e)) * (e % 3 == 1 ? -1 : 1);
  return a;
}

template <class T>
std::vector<T> to_host_type(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

inline std::vector<double> array_values(const Array& a) { return host_values(a); }

inline Array put_values(const std::vector<double>& v, const Shape& shape, DType dt,
                        const Sharding& s) {
  switch (dt) {
    case DType::f32:
      return device_put(to_host_type<float>(v), shape, s);
    case DType::f64:
      return device_put(v, shape, s);
    case DType::i32:
      return device_put(to_host_type<int32_t>(v), shape, s);
    case DType::i64:
      return device_put(to_host_type<int64_t>(v), shape, s);
    case DType::bool_: {
      std::vector<bool> b;
      for (double x : v) b.push_back(x != 0);
      return device_put(b, shape, s);
    }
  }
  throw std::logic_error("dtype");
}

// Group of device p for `axes` (names, in the order written), as JAX forms it.
struct HostGroup {
  std::vector<int64_t> members;  // by group index
  int64_t me = 0;
};
inline HostGroup host_group(const Mesh& mesh, const std::vector<std::string>& axes, int64_t p) {
  const Shape& ms = mesh.shape();
  auto coords = [&](int64_t q) {
    std::vector<int64_t> c(ms.size());
    for (size_t i = ms.size(); i-- > 0;) {
      c[i] = q % ms[i];
      q /= ms[i];
    }
    return c;
  };
  std::vector<int> named;
  for (const auto& a : axes) named.push_back(mesh.axis_position(a));
  auto cp = coords(p);
  int64_t n = 1;
  for (int a : named) n *= ms[static_cast<size_t>(a)];
  HostGroup g;
  g.members.assign(static_cast<size_t>(n), -1);
  for (int64_t q = 0; q < mesh.size(); ++q) {
    auto cq = coords(q);
    bool same = true;
    for (size_t i = 0; i < ms.size(); ++i) {
      if (std::find(named.begin(), named.end(), static_cast<int>(i)) == named.end() &&
          cq[i] != cp[i])
        same = false;
    }
    if (!same) continue;
    int64_t idx = 0;
    for (int a : named) idx = idx * ms[static_cast<size_t>(a)] + cq[static_cast<size_t>(a)];
    g.members[static_cast<size_t>(idx)] = q;
    if (q == p) g.me = idx;
  }
  return g;
}

// Runs body(ctx, x) with device p holding device_input(p, block) (as dtype `dt`), and checks
// device p's output against ref(inputs of p's group in group order, p's group index).
template <class Body, class Ref>
void check_collective(const Mesh& mesh, const std::vector<std::string>& axes, const Shape& block,
                      DType dt, Body body, Ref ref, const std::string& what) {
  const int64_t m = mesh.size();
  std::vector<double> global;
  for (int64_t p = 0; p < m; ++p) {
    HostArr x = device_input(p, block);
    global.insert(global.end(), x.v.begin(), x.v.end());
  }
  Shape gshape = block;
  gshape[0] *= m;
  PartitionSpec all = P(Axes(mesh.axis_names()));
  Array x = put_values(global, gshape, dt, NamedSharding(mesh, all));
  Array out =
      shard_map([&](Context& ctx, const Tensor& t) { return body(ctx, t); }, mesh, {all}, all)(x);
  std::vector<double> got = array_values(out);
  const int64_t per = static_cast<int64_t>(got.size()) / m;
  for (int64_t p = 0; p < m; ++p) {
    HostGroup g = host_group(mesh, axes, p);
    std::vector<HostArr> xs;
    for (int64_t q : g.members) xs.push_back(device_input(q, block));
    HostArr want = ref(xs, g.me);
    ASSERT_EQ(static_cast<int64_t>(want.v.size()), per) << what;
    std::vector<double> mine(got.begin() + p * per, got.begin() + (p + 1) * per);
    EXPECT_EQ(mine, want.v) << what << " on " << mesh.devices()[static_cast<size_t>(p)].str() << " "
                            << mesh.str();
  }
}

// Every ordered tuple of distinct mesh axes (single axes first).
inline std::vector<std::vector<std::string>> axis_choices(const Mesh& mesh) {
  std::vector<std::vector<std::string>> out;
  const auto& n = mesh.axis_names();
  std::function<void(std::vector<std::string>&)> rec = [&](std::vector<std::string>& cur) {
    if (!cur.empty()) out.push_back(cur);
    for (const auto& a : n) {
      if (std::find(cur.begin(), cur.end(), a) != cur.end()) continue;
      cur.push_back(a);
      rec(cur);
      cur.pop_back();
    }
  };
  std::vector<std::string> cur;
  rec(cur);
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.size() < b.size(); });
  return out;
}

inline std::string axes_label(const std::vector<std::string>& axes) {
  std::string s = "(";
  for (const auto& a : axes) s += a + ",";
  return s + ")";
}

inline bool in_mesh_order(const Mesh& mesh, const std::vector<std::string>& axes) {
  for (size_t i = 1; i < axes.size(); ++i) {
    if (mesh.axis_position(axes[i - 1]) > mesh.axis_position(axes[i])) return false;
  }
  return true;
}

}  // namespace meshrt::test

namespace meshrt::test {
inline void PrintTo(const MeshCase& c, std::ostream* os) {
  *os << c.platform << " " << c.algo << " mesh " << shape_str(c.shape);
}
}  // namespace meshrt::test
