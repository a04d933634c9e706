// The synchronisation of the shared-memory collectives: every local rank
// announces the generation it reached in its control block, then waits until
// all have reached it. Waiting spins for ROCE_PG_SPIN_US, then sleeps on the
// lagging rank's futex word, which that rank bumps when it arrives: no rank
// sleeps past its peers' arrival, and none burns a core while it waits.
#pragma once

namespace roce {

class Communicator;
class NodeShm;

namespace detail {
void shmBarrier(Communicator& c, NodeShm& shm);
// The barrier collective of a group on one machine (c10d's barrier): one
// shmBarrier, announced and checked like the other shared-memory
// collectives, so that a rank calling barrier while another calls one of
// them fails on both instead of pairing the two. No message, so no ring is
// allocated, where the dissemination barrier sent lg(n) messages per rank.
void shmBarrierCollective(Communicator& c);
}  // namespace detail

}  // namespace roce
