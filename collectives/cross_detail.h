// collectives/cross_detail.h: what the files of a collective across processes share: cross.cpp
// (the agreement check and the data steps that ride on it), cross_reduce.cpp (the large
// reductions the local members share) and cross_native.cpp (the platform library's communicators
// spanning processes). Internal to those files; the interface is collectives/cross.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/process_comm.h"
#include "collectives/plane.h"
#include "collectives/rendezvous.h"

namespace meshrt::coll::cross_detail {

// "0, 2, 3".
std::string procs_str(const std::vector<int>& procs);

// Fails `inst` (its local members get `message`) and throws it; `broken` also marks the job's
// process layer broken (a transfer may be half done: nothing across processes can follow).
[[noreturn]] void fail(Session& session, Instance& inst, const std::string& message, bool broken);

// Group indices of this process's members.
std::vector<int64_t> local_members(const Session& session, const Instance& inst);

// A large reduction whose work the process's members share (cross_finish).
bool shared_reduction(const Session& session, const Instance& inst);

// The staging of a shared reduction.
struct Stage {
  std::unique_ptr<char[]> data;  // pmean's sum (other reductions sum into an output)
  std::vector<int> procs;        // the group's processes, sorted
  int me = 0;                    // this process's index in procs
  int64_t slices = 1;            // slices of the exchange: the fewest members any process has
  int key = 0;
  std::chrono::steady_clock::time_point deadline;
  std::once_flag failed_once;
  std::atomic<bool> failed{false};
  std::string error;  // written once, before `failed` is set
};

// The cuda path's part of a process's agreement message: its members' devices (group order)
// and why its library cannot serve them ("" when it can): "3,5|".
std::string device_report(const Instance& inst, const Plane& pl, const std::vector<int64_t>& local);

// After the agreement, on a device platform: the group as its library names it (every process's
// devices, from the agreement messages), its communicators opened on first use (the process of
// member 0 makes the library's token, the others receive it over the ProcessComm), and work
// buffers for the library's algorithm where the call was set up for another. The members then
// run the native algorithm (collectives/collective.cpp).
void open_spanning(Session& session, Instance& inst, const Plane& pl,
                   const std::vector<int>& proc_of, const std::vector<int>& procs, int key,
                   backend::ProcessComm::Deadline deadline, const std::vector<std::string>& theirs,
                   size_t header, const std::string& mine);

}  // namespace meshrt::coll::cross_detail
