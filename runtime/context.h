// runtime/context.h: what a shard_map body sees on its device: its place in the mesh and the
// collectives (JAX's psum, pmean, pmax, pmin, all_gather, psum_scatter, ppermute, all_to_all).
//
// Output shapes, for a group of N devices and an input block of shape s:
//   psum, pmean, pmax, pmin        s (pmean of an integer type gives a float type)
//   all_gather(axis, tiled=false)  s with a new dimension of size N inserted at `axis`
//   all_gather(axis, tiled=true)   s with s[axis] multiplied by N
//   psum_scatter(dim, tiled=false) s without `dim` (s[dim] must equal N)
//   psum_scatter(dim, tiled=true)  s with s[dim] divided by N
//   ppermute                       s (zeros where no pair sends to this device)
//   all_to_all(split, concat)      s with s[split] divided by N and s[concat] multiplied by N
//                                  (tiled=false: s[split] must equal N, dimension `split` is
//                                  removed and a new one of size N is inserted at `concat`)
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/mesh.h"
#include "runtime/tensor.h"

namespace meshrt {

namespace detail {
struct BodyState;
struct PendingState;
}  // namespace detail

// One mesh axis name or several ("x", {"x", "y"}); several are mixed radix, first name major.
class AxisNames {
 public:
  // One axis: ctx.psum(x, "x").
  AxisNames(const char* name) : names_{name} {}
  // One axis, from a std::string.
  AxisNames(std::string name) : names_{std::move(name)} {}
  // Several axes, first major: ctx.psum(x, {"x", "y"}).
  AxisNames(std::initializer_list<std::string> names) : names_(names) {}
  // Several axes from a vector, first major.
  explicit AxisNames(std::vector<std::string> names) : names_(std::move(names)) {}
  // The axis names, first major.
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
};

// How a collective moves its data. automatic: MESHRT_COLLECTIVE_ALGO (auto, direct, ring,
// bidi_ring, native) when set, else the platform's choice (cpu: direct; cuda: native (NCCL) when
// the group's members are on distinct GPUs, direct where logical devices share a GPU).
// direct: one-shot over shared memory; ring: unidirectional, chunked and pipelined;
// bidi_ring: halves travelling in opposite directions; native: the platform's own (NCCL on cuda,
// an error naming the devices where two members share a GPU; direct on cpu). Every algorithm gives
// the same results up to floating-point summation order, bit-identical on every device of a group.
enum class CollectiveAlgo {
  automatic,  // MESHRT_COLLECTIVE_ALGO, else the platform's choice
  direct,     // one shot over shared memory
  ring,       // unidirectional ring, chunked and pipelined
  bidi_ring,  // halves travelling in opposite directions
  native,     // the platform's library (NCCL on cuda)
};

// The algorithm named `name`: "auto", "direct", "ring", "bidi_ring" or "native" (the values of
// MESHRT_COLLECTIVE_ALGO). Throws meshrt::Error listing the names for any other string.
CollectiveAlgo parse_collective_algo(std::string_view name);
// The name parse_collective_algo reads: "auto" for CollectiveAlgo::automatic, else the
// enumerator's name.
std::string_view collective_algo_name(CollectiveAlgo algo);

// Options of one collective call (the last argument of the Context collectives).
struct CollectiveOptions {
  CollectiveAlgo algo = CollectiveAlgo::automatic;  // how the data moves
  // Reductions give the same bits under every algorithm: ((x0 op x1) op x2)... in group-index
  // order, as direct computes them. ring/bidi_ring then all-gather the inputs over the ring and
  // fold locally (N times the input in staging memory). Also MESHRT_DETERMINISTIC=1.
  bool deterministic = false;
};

// PendingTensor: the result of an asynchronous collective (Context::ppermute_start,
// all_gather_start). The device has joined the collective when the handle is made; wait() blocks
// until its output is complete and returns it.
//
// Lifetime: wait() once, inside the body that started the collective, on its thread; after that
// (or when moved from, or default-constructed) valid() is false and wait() is an Error. Wait for
// every collective you start: destroying (or assigning over) a valid PendingTensor abandons this
// device's part and its result. Peers of a direct collective still complete; peers of a ring one
// (it relays through every member) fail with an Error once this body returns; under native
// (NCCL) the peers' library calls are already queued on their GPUs and cannot be recalled, so
// never abandon one there. Movable, not copyable, not thread-safe.
//
//   PendingTensor next = ctx.ppermute_start(block, "x", perm);
//   Tensor partial = matmul(block, w);  // overlaps the transfer
//   block = next.wait();
class PendingTensor {
 public:
  // An empty handle: valid() is false.
  PendingTensor();
  // Takes over the collective; the moved-from handle is no longer valid().
  PendingTensor(PendingTensor&&) noexcept;
  // Abandons this handle's collective if still valid (see Lifetime), then takes over the other's.
  PendingTensor& operator=(PendingTensor&&) noexcept;
  ~PendingTensor();
  // Blocks until the collective's output on this device is complete, then returns it. Throws
  // Error when the collective fails (a mismatched or abandoned call) or the handle is not valid.
  Tensor wait();
  // True from the start until wait() (or a move) takes the result.
  bool valid() const;

 private:
  friend class Context;  // the only maker
  explicit PendingTensor(std::unique_ptr<detail::PendingState> state);
  std::unique_ptr<detail::PendingState> state_;
};

// Context: what a body sees on its device: the device, the mesh, its place in the mesh, and the
// collectives. shard_map makes one per device body and passes it by reference; user code cannot
// construct one. Valid only inside that body, and only on its thread (not thread-safe).
//
// A collective is a meeting of every device of the group its axes define: each of them must make
// the same collective calls, with the same arguments, in the same order. A mismatch, a device
// that returns or throws while peers wait for it, or a wait-for cycle is an Error on every
// participant, raised at once (MESHRT_COLLECTIVE_TIMEOUT, default 300 s, catches bodies stuck in
// user code). Results of reductions are bit-identical on every device of a group.
class Context {
 public:
  // The device this body runs on, and the mesh of the shard_map.
  Device device() const;
  // The mesh the shard_map runs over.
  const Mesh& mesh() const;
  // Mixed radix over axes (first name major): the device's index in its group.
  int64_t axis_index(const AxisNames& axes) const;
  // The number of devices in the group (the product of the axes' sizes).
  int64_t axis_size(const AxisNames& axes) const;

  // Elementwise sum over the group; every member gets the result.
  Tensor psum(const Tensor& x, const AxisNames& axes, const CollectiveOptions& options = {});
  // psum / group size; integer inputs give floats (int32 -> float32, int64 -> float64).
  Tensor pmean(const Tensor& x, const AxisNames& axes, const CollectiveOptions& options = {});
  // Elementwise maximum / minimum over the group.
  Tensor pmax(const Tensor& x, const AxisNames& axes, const CollectiveOptions& options = {});
  // Elementwise minimum over the group.
  Tensor pmin(const Tensor& x, const AxisNames& axes, const CollectiveOptions& options = {});
  // Every member's block, in group order, stacked at `axis` (tiled: concatenated along it).
  Tensor all_gather(const Tensor& x, const AxisNames& axes, int axis = 0, bool tiled = false,
                    const CollectiveOptions& options = {});
  // The sum over the group, split along `scatter_dimension`: member i keeps part i.
  Tensor psum_scatter(const Tensor& x, const AxisNames& axes, int scatter_dimension = 0,
                      bool tiled = false, const CollectiveOptions& options = {});
  // (src, dst) pairs of group indices; destinations no pair names receive zeros.
  Tensor ppermute(const Tensor& x, const AxisNames& axes,
                  const std::vector<std::pair<int64_t, int64_t>>& perm);
  // Part j of `split_axis` goes to member j; received parts are placed in group order along
  // `concat_axis`.
  Tensor all_to_all(const Tensor& x, const AxisNames& axes, int split_axis, int concat_axis,
                    bool tiled = false, const CollectiveOptions& options = {});

  // Asynchronous forms: the call joins the collective now and returns; wait() gives the result.
  // The body may compute in between (collective matmul overlaps its ring steps this way).
  PendingTensor ppermute_start(const Tensor& x, const AxisNames& axes,
                               const std::vector<std::pair<int64_t, int64_t>>& perm);
  // all_gather, started now: wait() on the handle gives its result.
  PendingTensor all_gather_start(const Tensor& x, const AxisNames& axes, int axis = 0,
                                 bool tiled = false, const CollectiveOptions& options = {});

 private:
  friend struct detail::BodyState;  // shard_map makes one Context per device body
  explicit Context(detail::BodyState& state) : state_(&state) {}
  detail::BodyState* state_;
};

}  // namespace meshrt
