// backends/process_comm.h: the library that moves host memory between the processes of one job
// (Open MPI, backends/mpi/), behind one interface.
//
// One ProcessComm per process, installed by distributed::initialize() when the program runs under
// mpirun with several processes; process_comm() is null otherwise, and nothing above pays for it.
// Every wait has a deadline: a call returns what did not complete instead of blocking forever, so
// the layers above turn a missing or dead process into an error naming it. Thread-safe: device
// executors call concurrently; on one (procs, key), concurrent send_recv_group calls use distinct
// tags (a shared reduction's members), and the group's other calls are sequential.
//
// Sizes are int64_t everywhere: a transfer above the library's message limit
// (config::mpi_max_message_bytes(), by default INT_MAX rounded down to 64 bytes: MPI's counts are
// ints) moves as several messages in order, so callers never split their data. A transfer whose
// size differs between its two sides is an error naming both processes (the job is then broken,
// as after a timeout), never a silent truncation.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"

namespace meshrt::backend {

class ProcessComm {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  virtual ~ProcessComm() = default;
  // The library's name for messages ("Open MPI 4.1.4").
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The largest tag and key the library takes (MPI_TAG_UB).
  virtual int max_tag() const = 0;

  // Sends `mine` to every other process of `procs` (sorted ranks, this one included) and
  // receives theirs into out[k] (procs order; out[k] = mine for this process). `tag` separates
  // exchanges that may run at once. Returns the ranks that had not answered by `deadline`
  // (empty: complete). `what` names the pending operation should mpirun end the process while it
  // waits (a peer died): the message printed then.
  virtual std::vector<int> exchange(const std::vector<int>& procs, int tag, const std::string& mine,
                                    std::vector<std::string>& out, Deadline deadline,
                                    const std::string& what) = 0;
  // Creates the communicator of (procs, key) unless it exists (collective over `procs`: every
  // process of the group calls it with the same key, and before several of its threads use the
  // group at once). Cached for the job's life; all_gather and send_recv_group open it too.
  // False when the other processes had not joined by `deadline`.
  virtual bool open_group(const std::vector<int>& procs, int key, Deadline deadline) = 0;
  // out = each process's `counts[k]` bytes (procs order) concatenated; `in` holds this one's. One
  // MPI collective while the total fits one message, else point to point on the group's
  // communicator under tag max_tag().
  virtual bool all_gather(const std::vector<int>& procs, int key, const void* in, void* out,
                          const std::vector<int64_t>& counts, Deadline deadline) = 0;
  // One transfer between this process and `peer`: both sides name the same tag and byte count.
  struct Transfer {
    int peer;  // rank
    int tag;   // 0..max_tag() (send_recv), 0..max_tag() - 1 (send_recv_group)
    void* data;
    int64_t bytes;  // any size >= 0
  };
  // Point-to-point on the job's resharding channel: posts every transfer, waits for all.
  // Returns the peers of transfers not complete by `deadline` (empty: complete). Transfers
  // between one pair under one tag match in the order both sides list them.
  virtual std::vector<int> send_recv(const std::vector<Transfer>& sends,
                                     const std::vector<Transfer>& recvs, Deadline deadline,
                                     const std::string& what) = 0;
  // The same on the communicator of (procs, key) (all_reduce's), whose messages no other group
  // sees: tags need only be distinct within the call, and below max_tag() (all_gather's). Peers
  // are job ranks in `procs`.
  virtual std::vector<int> send_recv_group(const std::vector<int>& procs, int key,
                                           const std::vector<Transfer>& sends,
                                           const std::vector<Transfer>& recvs, Deadline deadline,
                                           const std::string& what) = 0;

  // A cross-process wait failed: the job's message state is undefined from here on. Later calls
  // throw at once, and the process ends the job at exit (MPI_Abort) so no peer is left waiting.
  virtual void mark_broken(const std::string& why) = 0;
  // Why the job cannot communicate any more ("" while healthy).
  virtual std::string broken() const = 0;
};

// This process's communication library, or null when the program runs as one process.
ProcessComm* process_comm();
// Installs it (distributed::initialize): once, before any cross-process use. Kept until exit.
void set_process_comm(std::unique_ptr<ProcessComm> comm);

// Whether this build contains the MPI backend (MESHRT_BUILD_MPI).
bool mpi_backend_built();
// Initialises MPI (MPI_THREAD_MULTIPLE) and returns the job's communication library; registers
// the exit step (a bounded final handshake, then MPI_Finalize; MPI_Abort when broken). Throws a
// meshrt::Error when MPI is not built in or cannot start.
std::unique_ptr<ProcessComm> make_mpi_comm(std::chrono::milliseconds timeout);

}  // namespace meshrt::backend
