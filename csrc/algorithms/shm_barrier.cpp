#include "shm_barrier.hpp"

#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "../common/spin.hpp"
#include "../transport/shm/node_shm.hpp"
#include "shm_call.hpp"

namespace roce::detail {

void shmBarrier(Communicator& c, NodeShm& shm) {
  const uint64_t gen = ++c.shmBarrierGeneration;
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
  c.waitUntil(all, [&] { return str("rank ", c.topology().localRanks[lagging], " (shared-memory barrier)"); },
              [&] { shm.control(lagging)->arrivals.sleep([&] { return arrived(lagging); }, kSleepNs); });
}

void shmBarrierCollective(Communicator& c) {
  const ShmCall call{ShmCollective::Barrier};
  auto nothing = [](int, size_t, size_t) {};
  overSlots(c, *c.nodeShm(), call, 0, 1, 0, nothing, nothing);
}

}  // namespace roce::detail
