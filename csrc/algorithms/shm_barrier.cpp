#include "shm_barrier.hpp"

#include <cstdint>

#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "../common/spin.hpp"
#include "../transport/shm/node_shm.hpp"
#include "shm_call.hpp"

namespace roce::algorithms::detail {
using namespace roce::comm;
using namespace roce::transport::shm;

void shmBarrier(Communicator& c, NodeShm& shm, uint64_t barrierTag) {
  const uint64_t gen = ++c.algorithmState().shmBarrierGeneration;
  const int n = shm.localSize();
  ShmRankControl* mine = shm.control(shm.localIndex());
  // seq_cst: orders this store before the read of the sleepers count in
  // notify() (see ShmWakeup), and publishes everything written before it.
  mine->arrived.store(gen, std::memory_order_seq_cst);
  mine->arrivals.notify();

  int lagging = 0;  // ranks below it have arrived
  auto arrived = [&](int j) { return shm.control(j)->arrived.load(std::memory_order_seq_cst) >= gen; };
  auto all = [&] {
    while (lagging < n && arrived(lagging)) ++lagging;
    return lagging == n;
  };
  if (spinFor(all, std::chrono::microseconds(c.config().spinUs))) return;
  // Sleep on the first rank still missing; bounded, so that deadlines, abort
  // and peer failures are still checked by the communicator's wait loop.
  constexpr long kSleepNs = 1000000;
  // A rank that runs a message collective under this barrier's tag never
  // arrives here: its collective waits for this rank's messages. A rank
  // that arrived and went on to its next message collective takes that
  // tag too, legitimately: acquire, then look at its arrival again (it
  // stored that before the tag).
  auto allOrMismatch = [&] {
    if (all()) return true;
    if (barrierTag != 0 &&
        shm.control(lagging)->collectiveTag.load(std::memory_order_acquire) == barrierTag << 1 && !arrived(lagging))
      throwComm(str("collective mismatch: rank ", c.rank(), " runs barrier but rank ", c.topology().localRanks[lagging],
                    " runs a collective that exchanges messages (gather, scatter, all_to_all, or one forced onto a "
                    "point-to-point algorithm) as the same call. Every rank must call the same collectives in the "
                    "same order"));
    return false;
  };
  c.waitUntil(allOrMismatch, [&] { return str("rank ", c.topology().localRanks[lagging], " (shared-memory barrier)"); },
              [&] { shm.control(lagging)->arrivals.sleep([&] { return arrived(lagging); }, kSleepNs); });
}

void shmBarrierCollective(Communicator& c, uint64_t tag) {
  // overSlots' one chunk, with nothing to publish or read, and the tag
  // check in the barrier's wait.
  NodeShm& shm = *c.nodeShm();
  const ShmCall call{ShmCollective::Barrier};
  const int buf = static_cast<int>(c.algorithmState().shmIteration++ & 1);
  announceCall(shm, buf, call);
  shmBarrier(c, shm, tag);
  checkSameCall(c, shm, buf, call);
}

}  // namespace roce::algorithms::detail
