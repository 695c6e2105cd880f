// backends/native_comm.h: a vendor collective library (NCCL now, MPI next) behind one interface.
//
// One NativeComm per backend, handed out by Backend::native_comm(), not one per device group:
// the library's communicators are per group, but creating, caching, bounding and retiring them
// is the library's business (NCCL splits every ordered group from one parent per GPU set, and
// retires a communicator only once no member can still use it). Callers name the group on
// every call and never hold a communicator, so no handle can outlive an eviction.
//
// Every member of `group` (device indices in group order) makes the same call, after the
// collectives layer's rendezvous has matched them; work is queued on the member's
// communication stream (as the collective primitives of backends/backend.h) and is complete
// after that member's Backend::coll_fence. Thread-safe: members call from their own executors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"

namespace meshrt::backend {

class NativeComm {
 public:
  virtual ~NativeComm() = default;
  // The library's name for messages ("NCCL").
  virtual std::string_view name() const = 0;
  // Why the library cannot serve `group` ("" when it can); calls on such a group throw.
  virtual std::string unavailable(const std::vector<int>& group) = 0;

  // out = fold(op) of the members' `count` elements (sum, max, min; mean is the caller's divide).
  virtual void all_reduce(int device, const std::vector<int>& group, FoldOp op, DType dtype,
                          const void* in, void* out, int64_t count) = 0;
  // out = the members' `bytes` each, concatenated in group order.
  virtual void all_gather(int device, const std::vector<int>& group, const void* in, void* out,
                          int64_t bytes) = 0;
  // out = sum over members of their input's chunk `my group index` (`count` elements per chunk).
  virtual void reduce_scatter(int device, const std::vector<int>& group, DType dtype,
                              const void* in, void* out, int64_t count) = 0;
  struct Transfer {
    int64_t peer;  // group index
    void* data;
    int64_t bytes;
  };
  // Posts all sends and receives as one group (no ordering deadlock), then returns.
  virtual void send_recv(int device, const std::vector<int>& group,
                         const std::vector<Transfer>& sends,
                         const std::vector<Transfer>& recvs) = 0;
};

}  // namespace meshrt::backend
