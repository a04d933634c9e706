// The algorithms' door to the process's worker pool (common/worker_pool.hpp):
// a rank's local copies and reductions split by element range over the
// calling thread and ROCE_PG_WORKERS - 1 pool threads. A range computes
// exactly what the whole would for its elements, so results are the same
// bits for any worker count, and nothing about the split reaches a peer.
#pragma once
#include <algorithm>
#include <cstddef>

#include "../comm/communicator.hpp"
#include "../common/worker_pool.hpp"
#include "../reduce/reduce.hpp"

namespace roce::algorithms::detail {
using namespace roce::comm;
using namespace roce::reduce;

// A range is only worth another thread above this size: waking a sleeping
// worker costs microseconds, copying 16 KiB a fraction of one.
constexpr size_t kMinSliceBytes = 16u << 10;

// Runs body(lo, hi) over element ranges covering [0, n) on the rank's
// threads, cut at 64-byte multiples from the start (with an aligned buffer,
// no two threads write one cache line), and counts the ranges the pool's
// threads ran (Counters::workerSlices).
template <class Body>
void onWorkers(Communicator& c, size_t n, size_t esz, Body&& body) {
  const size_t ran = WorkerPool::process().forRanges(n, std::max<size_t>(1, 64 / esz),
                                                     std::max<size_t>(1, kMinSliceBytes / esz), c.workers(), body);
  if (ran) Counters::add(c.counters().workerSlices, ran);
}

// reduceInto (acc[i] = acc[i] op in[i]) on the rank's threads: the
// receive-side reduction of the ring, tree and recursive algorithms.
inline void reduceIntoOnWorkers(Communicator& c, DataType t, ReduceOp op, void* acc, const void* in, size_t n) {
  const size_t esz = elementSize(t);
  onWorkers(c, n, esz, [&](size_t lo, size_t hi) {
    reduceInto(t, op, static_cast<char*>(acc) + lo * esz, static_cast<const char*>(in) + lo * esz, hi - lo);
  });
}

}  // namespace roce::algorithms::detail
