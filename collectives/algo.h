// collectives/algo.h: the collective algorithms by name, and which one a call runs with.
//
// One table names every algorithm: MESHRT_COLLECTIVE_ALGO's values, CollectiveAlgo's names
// (parse_collective_algo) and meshrt-bench's --algo all come from it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace meshrt::coll {

// How the data moves. direct: one-shot over shared memory (XLA's CPU collectives); ring and
// bidi_ring: written against Transport (collectives/ring.h); all_to_all uses a pairwise-exchange
// schedule under ring and bidi_ring; ppermute is one step under every algorithm.
// native: the platform's collective library (NCCL on cuda), behind the same rendezvous.
// automatic: the call names none (choose_algo settles it; a Call never holds it).
// The enumerators match CollectiveAlgo's, in the same order.
enum class Algo { automatic, direct, ring, bidi_ring, native };

// "auto", "direct", "ring", "bidi_ring", "native".
std::string_view algo_name(Algo a);
// The algorithm named `name` (exactly as algo_name spells it), or nullopt.
std::optional<Algo> parse_algo(std::string_view name);
// Every name, in Algo order, comma-separated: "auto, direct, ring, bidi_ring, native".
std::string algo_names();

// What picks a call's algorithm: the call's own options, or the environment's
// (MESHRT_COLLECTIVE_ALGO, MESHRT_DETERMINISTIC).
struct AlgoRequest {
  Algo algo = Algo::automatic;
  bool deterministic = false;
};
struct AlgoChoice {
  Algo algo;           // never automatic
  bool deterministic;  // reductions fold in group-index order (direct's bits)
};

// The algorithm one call of `op` runs with: the call's, unless automatic; else the
// environment's, unless automatic; else the platform's choice. On memory every member addresses
// (`host_memory`: cpu) native and automatic are direct, the one-shot algorithm. On a device
// platform they are native (NCCL) where the platform's library can serve the group, its members
// on distinct GPUs; where it cannot (logical devices sharing a GPU) automatic is direct and an
// explicit native throws meshrt::Error naming `op` and the reason. `why_not_native` gives that
// reason ("" when the library can serve the group); it is called only when the choice depends
// on it. Deterministic when either request asks for it.
AlgoChoice choose_algo(std::string_view op, AlgoRequest call, AlgoRequest env, bool host_memory,
                       const std::function<std::string()>& why_not_native);

}  // namespace meshrt::coll
