// Ring reduce-scatter and allgather over segments indexed by ring position
// (Communicator::topology().ringOrder), chunked so that receiving chunk k+1
// overlaps reducing chunk k.
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
void ringReduceScatter(Communicator& c, uint64_t tag, void* data, const RingSegments& segs, DataType t,
                       ReduceOp op);
// Starting with segment q complete at position q, leaves every segment everywhere.
void ringAllgather(Communicator& c, uint64_t tag, void* data, const RingSegments& segs, size_t elemSize);

}  // namespace roce
