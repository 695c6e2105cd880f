// collectives/cross.h: a collective whose group spans several processes, in two levels.
//
// The members of each process rendezvous as usual (collectives/rendezvous.h: members of other
// processes count as arrived). The member completing that local rendezvous then, before it
// publishes the instance:
//   1. checks that every process of the group makes the same call: each sends the others its
//      call's description (launch, call number, op, operand, axes, group), with a deadline;
//   2. reductions (psum, pmean, pmax, pmin): folds its process's inputs, makes one all-reduce
//      across processes, and writes every local output;
//      the rest (all_gather, psum_scatter, ppermute, all_to_all, and deterministic reductions):
//      one all-gather across processes of the members' inputs, after which the members run the
//      direct algorithm as if every input were local (the same code, the same bits).
// A mismatch, a process that does not come or a process that dies is an error on every process
// of the group, naming the processes and what each called.
#pragma once

#include "collectives/plane.h"
#include "collectives/rendezvous.h"

namespace meshrt::coll {

// Steps 1 and 2 for `inst` (inst.spans_processes()), by its completing member through `pl`.
// On failure fails the instance (its local members get the same error) and throws.
void cross_complete(Session& session, Instance& inst, const Plane& pl);

// Whether the step above already wrote every local output (then members skip the algorithm).
bool cross_done_at_arrival(const Call& call);

}  // namespace meshrt::coll
