// Estimated time of any collective or point-to-point call, for torch's time
// estimation API (Backend::startTimeEstimate / endTimeEstimate): allreduce
// from the cost model that picks its algorithm (cost_model.hpp), the others
// from the same constants in the alpha-beta forms of the algorithms roce runs
// for them (rings, binomial trees, flat exchanges; docs/ALGORITHMS.md). On one
// machine the shared-memory constants apply, across machines the network's.
#pragma once
#include <cstddef>

#include "../common/config.hpp"
#include "cost_model.hpp"

namespace roce::algorithms {

enum class CollectiveKind {
  Allreduce,      // bytes: each rank's vector
  Reduce,         // bytes: each rank's vector
  Broadcast,      // bytes: the vector
  Allgather,      // bytes: one rank's block
  ReduceScatter,  // bytes: each rank's whole input (p blocks)
  Gather,         // bytes: one rank's block
  Scatter,        // bytes: one rank's block
  AllToAll,       // bytes: each rank's whole input
  Barrier,        // bytes: ignored
  PointToPoint,   // bytes: the message
};

// Seconds (never negative; 0 on a group of one rank).
double estimateCall(const Config& cfg, const Shape& group, CollectiveKind kind, size_t bytes);

}  // namespace roce::algorithms
