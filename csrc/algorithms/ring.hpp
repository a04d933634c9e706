// Ring reduce-scatter and allgather over segments indexed by ring position,
// pipelined by chunk (ROCE_PG_CHUNK_BYTES): each chunk is forwarded to the
// next step as soon as it has landed and been reduced, while later chunks are
// still in flight. `order` lists
// the ring's members (group ranks): the whole group in
// Communicator::topology().ringOrder, or a subset (one machine's ranks, or one
// rank per machine, in the hierarchical allreduce); this rank must be in it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../common/dtype.hpp"

namespace roce {

class Communicator;

struct RingSegments {
  std::vector<size_t> offset;  // in elements, per ring position
  std::vector<size_t> count;
  size_t maxCount() const;
  // count elements split as evenly as possible over n positions.
  static RingSegments even(size_t count, int n);
  // Position q is the block of rank ringOrder[q], blocks of blockCount in rank order.
  static RingSegments blocks(const std::vector<int>& ringOrder, size_t blockCount);
};

// Afterwards ring position q holds the fully reduced segment q.
void ringReduceScatter(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data,
                       const RingSegments& segs, DataType t, ReduceOp op);
// Starting with segment q complete at position q, leaves every segment everywhere.
void ringAllgather(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, const RingSegments& segs,
                   size_t elemSize);
// Both in one pass (the allreduce): the reduce-scatter's last step streams
// straight into the allgather's first.
void ringReduceScatterAllgather(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data,
                                const RingSegments& segs, DataType t, ReduceOp op);

}  // namespace roce
