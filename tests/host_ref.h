// tests/host_ref.h: an independent host model of JAX's collective semantics (groups, order within
// a group, output shapes and values), written from the rules, sharing no code with meshrt's
// implementation.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace meshrt::test {

struct HostArr {
  std::vector<int64_t> shape;
  std::vector<double> v;
  int64_t at(const std::vector<int64_t>& idx) const {
    int64_t f = 0;
    for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
    return f;
  }
};

inline int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Visits every multi-index of `shape` in row-major order.
inline void for_each_index(const std::vector<int64_t>& shape,
                           const std::function<void(const std::vector<int64_t>&)>& f) {
  if (numel(shape) == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  for (;;) {
    f(idx);
    size_t d = shape.size();
    while (d > 0) {
      --d;
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (shape.empty()) return;
  }
}

inline HostArr make_arr(std::vector<int64_t> shape) {
  HostArr a{std::move(shape), {}};
  a.v.assign(static_cast<size_t>(numel(a.shape)), 0.0);
  return a;
}

// concatenate(xs, axis)
inline HostArr concat(const std::vector<HostArr>& xs, size_t axis) {
  std::vector<int64_t> s = xs[0].shape;
  s[axis] = 0;
  for (const auto& x : xs) s[axis] += x.shape[axis];
  HostArr out = make_arr(s);
  for_each_index(s, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> src = idx;
    size_t j = 0;
    while (src[axis] >= xs[j].shape[axis]) src[axis] -= xs[j++].shape[axis];
    out.v[static_cast<size_t>(out.at(idx))] = xs[j].v[static_cast<size_t>(xs[j].at(src))];
  });
  return out;
}

// stack(xs, axis): a new dimension at axis.
inline HostArr stack(const std::vector<HostArr>& xs, size_t axis) {
  std::vector<int64_t> s = xs[0].shape;
  s.insert(s.begin() + static_cast<std::ptrdiff_t>(axis), static_cast<int64_t>(xs.size()));
  HostArr out = make_arr(s);
  for_each_index(s, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> src = idx;
    int64_t j = src[axis];
    src.erase(src.begin() + static_cast<std::ptrdiff_t>(axis));
    out.v[static_cast<size_t>(out.at(idx))] =
        xs[static_cast<size_t>(j)].v[static_cast<size_t>(xs[static_cast<size_t>(j)].at(src))];
  });
  return out;
}

// split(x, n, axis)[k]
inline HostArr split_part(const HostArr& x, int64_t n, size_t axis, int64_t k) {
  std::vector<int64_t> s = x.shape;
  s[axis] /= n;
  HostArr out = make_arr(s);
  for_each_index(s, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> src = idx;
    src[axis] += k * s[axis];
    out.v[static_cast<size_t>(out.at(idx))] = x.v[static_cast<size_t>(x.at(src))];
  });
  return out;
}

// take(x, k, axis): removes the dimension.
inline HostArr take(const HostArr& x, int64_t k, size_t axis) {
  std::vector<int64_t> s = x.shape;
  s.erase(s.begin() + static_cast<std::ptrdiff_t>(axis));
  HostArr out = make_arr(s);
  for_each_index(s, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> src = idx;
    src.insert(src.begin() + static_cast<std::ptrdiff_t>(axis), k);
    out.v[static_cast<size_t>(out.at(idx))] = x.v[static_cast<size_t>(x.at(src))];
  });
  return out;
}

inline HostArr elementwise(const std::vector<HostArr>& xs,
                           const std::function<double(double, double)>& f) {
  HostArr out = xs[0];
  for (size_t j = 1; j < xs.size(); ++j) {
    for (size_t e = 0; e < out.v.size(); ++e) out.v[e] = f(out.v[e], xs[j].v[e]);
  }
  return out;
}

}  // namespace meshrt::test
