#include "bench/link_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

namespace meshrt::bench {

namespace {

double parse_number(const std::string& s, size_t& used) {
  try {
    return std::stod(s, &used);
  } catch (...) {
    throw Error("[link_model] '" + s + "' does not start with a number");
  }
}

double parse_time(const std::string& s) {
  size_t used = 0;
  double v = parse_number(s, used);
  std::string unit = s.substr(used);
  if (unit == "s") return v;
  if (unit == "ms") return v * 1e-3;
  if (unit == "us") return v * 1e-6;
  if (unit == "ns") return v * 1e-9;
  throw Error("[link_model] latency '" + s + "' needs a unit: ns, us, ms or s (e.g. 5us)");
}

double parse_bandwidth(const std::string& s) {
  size_t used = 0;
  double v = parse_number(s, used);
  std::string unit = s.substr(used);
  if (unit == "Bps" || unit == "B/s") return v;
  if (unit == "KBps" || unit == "KB/s") return v * 1e3;
  if (unit == "MBps" || unit == "MB/s") return v * 1e6;
  if (unit == "GBps" || unit == "GB/s") return v * 1e9;
  throw Error("[link_model] bandwidth '" + s +
              "' needs a unit: Bps, KBps, MBps or GBps (e.g. 100GBps)");
}

// Grid for a 2-D torus of n devices: the most square factorisation.
std::pair<int64_t, int64_t> torus_dims(int64_t n) {
  int64_t r = static_cast<int64_t>(std::sqrt(static_cast<double>(n)));
  while (r > 1 && n % r != 0) --r;
  return {r, n / r};
}

// Directed links of one ring (dimension) route: steps of +1 or -1 around a cycle of size m.
void route_cycle(int64_t a, int64_t b, int64_t m, std::vector<std::pair<int64_t, int64_t>>& hops) {
  const int64_t fwd = ((b - a) % m + m) % m, back = m - fwd;
  const int64_t dir = fwd <= back ? 1 : -1, len = std::min(fwd, back);
  for (int64_t k = 0, at = a; k < len; ++k) {
    const int64_t next = ((at + dir) % m + m) % m;
    hops.emplace_back(at, next);
    at = next;
  }
}

}  // namespace

LinkModel LinkModel::parse(const std::string& spec) {
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  if (parts.size() != 3) {
    throw Error("[link_model] '" + spec +
                "' is not topology:latency:bandwidth, e.g. ring:5us:100GBps");
  }
  Topology t;
  if (parts[0] == "ring")
    t = Topology::ring;
  else if (parts[0] == "torus2d")
    t = Topology::torus2d;
  else if (parts[0] == "full")
    t = Topology::full;
  else
    throw Error("[link_model] topology '" + parts[0] + "' is not ring, torus2d or full");
  return LinkModel(t, parse_time(parts[1]), parse_bandwidth(parts[2]));
}

std::string LinkModel::str() const {
  std::ostringstream os;
  os << (topo_ == Topology::ring      ? "ring"
         : topo_ == Topology::torus2d ? "torus2d"
                                      : "full")
     << ", alpha " << alpha_ * 1e6 << " us, beta " << beta_ / 1e9 << " GB/s per directed link";
  return os.str();
}

double LinkModel::step_time(int64_t n, const std::vector<Transfer>& transfers) const {
  std::map<std::pair<int64_t, int64_t>, double> load;
  int64_t max_hops = 0;
  for (const Transfer& t : transfers) {
    if (t.src == t.dst || t.bytes <= 0) continue;
    std::vector<std::pair<int64_t, int64_t>> hops;
    if (topo_ == Topology::full) {
      hops.emplace_back(t.src, t.dst);
    } else if (topo_ == Topology::ring) {
      route_cycle(t.src, t.dst, n, hops);
    } else {  // dimension-ordered: along the row (x) first, then the column (y)
      auto [rows, cols] = torus_dims(n);
      const int64_t sr = t.src / cols, sc = t.src % cols, dr = t.dst / cols, dc = t.dst % cols;
      std::vector<std::pair<int64_t, int64_t>> hx, hy;
      route_cycle(sc, dc, cols, hx);
      for (auto [a, b] : hx) hops.emplace_back(sr * cols + a, sr * cols + b);
      route_cycle(sr, dr, rows, hy);
      for (auto [a, b] : hy) hops.emplace_back(a * cols + dc, b * cols + dc);
    }
    max_hops = std::max<int64_t>(max_hops, static_cast<int64_t>(hops.size()));
    for (const auto& l : hops) load[l] += t.bytes;
  }
  double worst = 0;
  for (const auto& [l, b] : load) worst = std::max(worst, b);
  return alpha_ * static_cast<double>(max_hops) + worst / beta_;
}

double LinkModel::collective_time(Op op, CollectiveAlgo algo, int64_t n, double bytes) const {
  if (n <= 1) return 0;
  std::vector<Transfer> step;
  auto ring_steps = [&](int64_t steps, double chunk, bool bidi) {
    step.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (bidi) {
        step.push_back({i, (i + 1) % n, chunk / 2});
        step.push_back({i, (i + n - 1) % n, chunk / 2});
      } else {
        step.push_back({i, (i + 1) % n, chunk});
      }
    }
    return static_cast<double>(steps) * step_time(n, step);
  };
  // One-shot: every device exchanges `chunk` with every other device at once.
  auto all_pairs = [&](double chunk) {
    step.clear();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        if (i != j) step.push_back({i, j, chunk});
      }
    }
    return step_time(n, step);
  };
  const bool bidi = algo == CollectiveAlgo::bidi_ring;
  const double nn = static_cast<double>(n);
  switch (op) {
    case Op::all_reduce:  // reduce-scatter then all-gather
      if (algo == CollectiveAlgo::direct) return 2 * all_pairs(bytes / nn);
      return ring_steps(2 * (n - 1), bytes / nn, bidi);
    case Op::all_gather:      // bytes = gathered output
    case Op::reduce_scatter:  // bytes = input
      if (algo == CollectiveAlgo::direct) return all_pairs(bytes / nn);
      return ring_steps(n - 1, bytes / nn, bidi);
    case Op::all_to_all: {  // bytes = input; chunk bytes/n to every peer
      if (algo == CollectiveAlgo::direct) return all_pairs(bytes / nn);
      double t = 0;  // pairwise: step s sends to me + s
      for (int64_t s = 1; s < n; ++s) {
        step.clear();
        for (int64_t i = 0; i < n; ++i) step.push_back({i, (i + s) % n, bytes / nn});
        t += step_time(n, step);
      }
      return t;
    }
    case Op::ppermute:
      step.clear();
      for (int64_t i = 0; i < n; ++i) step.push_back({i, (i + 1) % n, bytes});
      return step_time(n, step);
  }
  return 0;
}

}  // namespace meshrt::bench
