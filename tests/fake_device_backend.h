// What the collectives-layer tests with stand-in GPU backends share (test_device_plane.cpp,
// test_multiprocess_native.cpp): a Backend base whose op kernels are unused, and the collective
// cases with their output shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "collectives/collective.h"
#include "core/error.h"

namespace meshrt::test {

// A backend for collective tests: device memory and the collective primitives are the
// subclass's; the op kernels, host copies and executors are never called (they throw).
class CollectivesOnlyBackend : public backend::Backend {
 public:
  CollectivesOnlyBackend() : Backend(/*host_memory=*/false) {}
  std::string unavailable_reason() const override { return ""; }
  void copy_2d(void*, int, size_t, const void*, int, size_t, size_t, size_t) override {
    throw Error("not used");
  }
  void unary(int, backend::UnaryOp, DType, DType, const std::vector<int64_t>&,
             const backend::Strided&, void*) override {
    throw Error("not used");
  }
  void binary(int, backend::BinaryOp, DType, DType, const std::vector<int64_t>&,
              const backend::Strided&, const backend::Strided&, void*) override {
    throw Error("not used");
  }
  void select(int, DType, const std::vector<int64_t>&, const backend::Strided&,
              const backend::Strided&, const backend::Strided&, void*) override {
    throw Error("not used");
  }
  void reduce(int, backend::ReduceOp, DType, int64_t, int64_t, int64_t, const void*,
              void*) override {
    throw Error("not used");
  }
  void matmul(int, DType, int64_t, int64_t, int64_t, int64_t, const void*, const void*,
              void*) override {
    throw Error("not used");
  }
  void fill(int, DType, int64_t, double, bool, void*) override { throw Error("not used"); }
  void submit(int, std::function<void()>) override { throw Error("not used"); }
};

// One collective call's shape: per member operand shape, axes and tiling.
struct CollectiveCase {
  coll::Kind kind;
  DType dtype;
  Shape shape;  // per member
  int64_t axis = 0, axis2 = 0;
  bool tiled = false;
};

// A member's output shape for `c` over `n` members.
inline Shape out_shape_of(const CollectiveCase& c, int64_t n) {
  Shape s = c.shape;
  const auto a = static_cast<size_t>(c.axis);
  switch (c.kind) {
    case coll::Kind::all_gather:
      if (c.tiled)
        s[a] *= n;
      else
        s.insert(s.begin() + static_cast<std::ptrdiff_t>(a), n);
      break;
    case coll::Kind::psum_scatter:
      if (c.tiled)
        s[a] /= n;
      else
        s.erase(s.begin() + static_cast<std::ptrdiff_t>(a));
      break;
    case coll::Kind::all_to_all:
      if (c.tiled) {
        s[a] /= n;
        s[static_cast<size_t>(c.axis2)] *= n;
      } else {
        s.erase(s.begin() + static_cast<std::ptrdiff_t>(a));
        s.insert(s.begin() + c.axis2, n);
      }
      break;
    default:
      break;
  }
  return s;
}

// The call of `c` over `n` members named by `axes` (kept alive by the caller); ppermute shifts by
// two and leaves one member receiving nothing.
inline coll::Call call_of(const CollectiveCase& c, coll::Algo algo, bool deterministic,
                          const std::vector<std::string>& axes, int64_t n) {
  coll::Call call;
  call.kind = c.kind;
  call.dtype = c.dtype;
  call.shape = c.shape;
  call.axes = &axes;
  call.axis = c.axis;
  call.axis2 = c.axis2;
  call.tiled = c.tiled;
  call.algo = algo;
  call.deterministic = deterministic;
  if (c.kind == coll::Kind::ppermute) {
    for (int64_t i = 0; i + 1 < n; ++i) call.perm.emplace_back(i, (i + 2) % n);
  }
  return call;
}

}  // namespace meshrt::test
