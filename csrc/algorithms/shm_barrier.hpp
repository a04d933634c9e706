// The synchronisation of the shared-memory collectives: every local rank
// announces the generation it reached in its control block, then waits until
// all have reached it. Waiting spins for ROCE_PG_SPIN_US, then sleeps on the
// lagging rank's futex word, which that rank bumps when it arrives: no rank
// sleeps past its peers' arrival, and none burns a core while it waits.
#pragma once
#include <cstdint>

namespace roce::comm {
class Communicator;
}
namespace roce::transport::shm {
class NodeShm;
}
namespace roce::algorithms {
using namespace roce::transport::shm;
using namespace roce::comm;


namespace detail {
// `barrierTag` (non-zero: the barrier collective's) also fails the group
// when the rank it waits for runs a message collective under that tag.
void shmBarrier(Communicator& c, NodeShm& shm, uint64_t barrierTag = 0);
// The barrier collective of a group on one machine (c10d's barrier): one
// shmBarrier, sending no message, so no ring is allocated (the
// dissemination barrier sent lg(n) messages per rank, each allocating its
// ring). A rank calling it while another calls a different collective fails:
// against a shared-memory collective on every rank alike (the call
// descriptors, as between those collectives), against one that exchanges
// messages (which would otherwise wait for the timeout) on this rank with a
// group-breaking error that releases the other.
void shmBarrierCollective(Communicator& c, uint64_t tag);
}  // namespace detail

}  // namespace roce::algorithms
