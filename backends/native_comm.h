// backends/native_comm.h: a vendor collective library (NCCL now, MPI next) behind one interface.
//
// One NativeComm per backend, handed out by Backend::native_comm(), not one per device group:
// the library's communicators are per group, but creating, caching, bounding and retiring them
// is the library's business (NCCL splits every ordered group from one parent per GPU set, and
// retires a communicator only once no member can still use it). Callers name the group on
// every call and never hold a communicator, so no handle can outlive an eviction.
//
// Every member of `group` makes the same call, after the collectives layer's rendezvous has
// matched them; work is queued on the member's communication stream (as the collective
// primitives of backends/backend.h) and is complete after that member's Backend::coll_fence.
// Thread-safe: members call from their own executors.
//
// A group may span several processes (under mpirun): its communicators are then opened first by
// open_spanning, on every process of the group at once, with a token the process holding member 0
// made (new_token) and sent to the others over the ProcessComm (backends/process_comm.h); the
// collectives layer does that after its agreement check, so the library is never entered by one
// process alone. A spanning group's communicators live as long as the job: evicting one on one
// process only would leave the others calling into it.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"

namespace meshrt::backend {

// One call's members in group order; the library's rank of a member is its group index.
struct CommGroup {
  std::vector<int> devices;    // per member: its device index within its process
  std::vector<int> processes;  // per member: its process (ProcessComm rank); empty: all in this one
  bool spans() const { return !processes.empty(); }
  auto operator<=>(const CommGroup&) const = default;
};

class NativeComm {
 public:
  virtual ~NativeComm() = default;
  // The library's name for messages ("NCCL").
  virtual std::string_view name() const = 0;
  // Why the library cannot serve a group whose members in this process are `group` (device
  // indices, in group order) ("" when it can); calls on such a group throw.
  virtual std::string unavailable(const std::vector<int>& group) = 0;

  // ---- groups spanning processes (group.spans()); `me` is this process's rank.
  // Whether this process's members of `group` have their communicators (open_spanning succeeded).
  virtual bool spanning_open(const CommGroup& group) = 0;
  // A fresh bootstrap token for one spanning group (NCCL: ncclGetUniqueId's bytes).
  virtual std::string new_token() = 0;
  // Creates the communicators of this process's members of `group` from `token` (the same bytes
  // on every process). Collective: returns once every process of the group has called it (NCCL's
  // init has no deadline; the caller's agreement step has just seen every process arrive).
  // Throws on failure, caching nothing. Called by one thread per process, before any member of
  // `group` calls below.
  virtual void open_spanning(const CommGroup& group, int me, const std::string& token) = 0;

  // out = fold(op) of the members' `count` elements (sum, max, min; mean is the caller's divide).
  virtual void all_reduce(int device, const CommGroup& group, FoldOp op, DType dtype,
                          const void* in, void* out, int64_t count) = 0;
  // out = the members' `bytes` each, concatenated in group order.
  virtual void all_gather(int device, const CommGroup& group, const void* in, void* out,
                          int64_t bytes) = 0;
  // out = sum over members of their input's chunk `my group index` (`count` elements per chunk).
  virtual void reduce_scatter(int device, const CommGroup& group, DType dtype, const void* in,
                              void* out, int64_t count) = 0;
  struct Transfer {
    int64_t peer;  // group index
    void* data;
    int64_t bytes;
  };
  // Posts all sends and receives as one group (no ordering deadlock), then returns.
  virtual void send_recv(int device, const CommGroup& group, const std::vector<Transfer>& sends,
                         const std::vector<Transfer>& recvs) = 0;
};

}  // namespace meshrt::backend
