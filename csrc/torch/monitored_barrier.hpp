// torch.distributed.monitored_barrier for roce, run through the c10d Store the
// group was created with rather than the data path: a rank that never arrives
// then costs only an error message, and the group's connections stay usable.
//
// Every rank but 0 announces its arrival under a key of this call and waits
// for rank 0's release. Rank 0 waits for the arrivals within the barrier's
// timeout, then releases the others with "ok" or with its error, so either
// every rank passes or every rank that arrived raises.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>

namespace roce::adapter {

struct MonitoredBarrierCall {
  int rank;
  int size;
  uint64_t sequence;                     // per group, counted by every rank alike
  std::chrono::milliseconds timeout;     // rank 0's limit for every other rank to arrive
  std::chrono::milliseconds releaseWait; // how long the other ranks wait for rank 0
  bool waitAllRanks;                     // name every missing rank, not only the first
};

// Returns when the barrier passed; raises c10::DistBackendError naming the
// ranks that did not arrive (rank 0) or rank 0's failure (the others).
void monitoredBarrier(c10d::Store& store, const MonitoredBarrierCall& call);

}  // namespace roce::adapter
