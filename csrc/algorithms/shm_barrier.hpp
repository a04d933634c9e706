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
}  // namespace detail

}  // namespace roce
