// collectives/cross.h: a collective whose group spans several processes, in two levels.
//
// The members of each process rendezvous as usual (collectives/rendezvous.h: members of other
// processes count as arrived). The member completing that local rendezvous then, before it
// publishes the instance:
//   1. checks that every process of the group makes the same call: each sends the others its
//      call's description (launch, call number, op, operand, axes, group), with a deadline;
//   2. reductions (psum, pmean, pmax, pmin) up to kSmallReduceBytes: its process's inputs
//      folded travel with that description, so one round trip both checks and reduces; it
//      writes every local output. Larger ones are shared by the local members (cross_finish):
//      each folds a slice of the process's inputs, all-reduces it with the members holding the
//      same slice in the other processes (point to point, in 1 MiB pieces: each process reduces
//      its part of a piece for the group and returns it, so every process gets the same bits),
//      and copies it into every local output, piece by piece while it is in cache. (Open MPI's
//      own MPI_Iallreduce took twice as long on 2 x 64 MiB here.)
//      the rest (all_gather, psum_scatter, ppermute, all_to_all, and deterministic reductions):
//      one all-gather across processes of the members' inputs, after which the members run the
//      direct algorithm as if every input were local (the same code, the same bits).
// On a device platform (cuda) step 1's message also carries each process's member devices, and
// step 2 is the platform's library (NCCL) over communicators spanning the group's processes:
// opened on first use (the process of member 0 makes NCCL's unique id and sends it to the others
// over the ProcessComm; each process inits its members' ranks, rank = group index) and kept for
// the job's life; then every member runs the native algorithm (collectives/native.h), whatever
// algorithm the call named. A group whose members in one process share a GPU
// (MESHRT_CUDA_DEVICES_PER_GPU > 1) is refused on every process, before NCCL is entered.
// A mismatch, a process that does not come or a process that dies is an error on every process
// of the group, naming the processes and what each called.
#pragma once

#include "backends/native_comm.h"
#include "collectives/plane.h"
#include "collectives/rendezvous.h"

namespace meshrt::coll {

// Steps 1 and 2 for `inst` (inst.spans_processes()), by its completing member through `pl`.
// On failure fails the instance (its local members get the same error) and throws.
void cross_complete(Session& session, Instance& inst, const Plane& pl);

// Whether the step above already wrote every local output (then members skip the algorithm).
bool cross_done_at_arrival(const Session& session, const Instance& inst);

// The group of a published instance that spans processes on a device platform, as its library
// names it (set by cross_complete).
const backend::CommGroup& spanning_group(Instance& inst);

// A member's part of a published instance that spans processes on host memory: the shared large
// reduction, or the direct algorithm over the gathered inputs. Throws when the step across
// processes fails.
void cross_finish(Session& session, Instance& inst, int64_t me, const Shape& out_shape);

}  // namespace meshrt::coll
