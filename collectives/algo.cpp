#include "collectives/algo.h"

#include <array>

#include "core/error.h"
#include "core/strings.h"

namespace meshrt::coll {

namespace {

struct Named {
  Algo algo;
  std::string_view name;
};

// Every algorithm and its name, in Algo order.
constexpr std::array<Named, 5> kAlgos = {{
    {Algo::automatic, "auto"},
    {Algo::direct, "direct"},
    {Algo::ring, "ring"},
    {Algo::bidi_ring, "bidi_ring"},
    {Algo::native, "native"},
}};

}  // namespace

std::string_view algo_name(Algo a) {
  for (const Named& n : kAlgos) {
    if (n.algo == a) return n.name;
  }
  return "?";
}

std::optional<Algo> parse_algo(std::string_view name) {
  for (const Named& n : kAlgos) {
    if (n.name == name) return n.algo;
  }
  return std::nullopt;
}

std::string algo_names() {
  return detail::join(kAlgos, ", ", [](const Named& n) { return std::string(n.name); });
}

AlgoChoice choose_algo(std::string_view op, AlgoRequest call, AlgoRequest env, bool host_memory,
                       const std::function<std::string()>& why_not_native) {
  const bool deterministic = call.deterministic || env.deterministic;
  const Algo asked = call.algo != Algo::automatic ? call.algo : env.algo;
  if (asked == Algo::direct || asked == Algo::ring || asked == Algo::bidi_ring)
    return {asked, deterministic};
  if (host_memory) return {Algo::direct, deterministic};  // cpu: native is the one-shot algorithm
  const std::string why = why_not_native();
  if (why.empty()) return {Algo::native, deterministic};
  if (asked == Algo::automatic) return {Algo::direct, deterministic};
  throw Error(detail::cat("[", op, "] algo native cannot serve this group: ", why,
                          "; use CollectiveAlgo::direct, ring or bidi_ring (automatic picks direct "
                          "here)"));
}

}  // namespace meshrt::coll
