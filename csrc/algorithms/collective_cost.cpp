#include "collective_cost.hpp"

#include <cmath>

namespace roce::algorithms {

double estimateCall(const Config& cfg, const Shape& s, CollectiveKind kind, size_t bytes) {
  const int p = s.ranks;
  if (p <= 1) return 0;
  const bool sharedMemory = s.machines == 1;
  const CostConstants k(cfg);
  const double alpha = sharedMemory ? k.shmAlpha : k.netAlpha, beta = sharedMemory ? k.shmBeta : k.netBeta;
  const double n = static_cast<double>(bytes), share = (p - 1.0) / p, steps = std::ceil(std::log2(p));
  // Ring reduce-scatter and allgather over n bytes in all: p-1 steps, (p-1)/p of n through each rank.
  const double reduceScatter = (p - 1) * alpha + share * n * (beta + k.gamma);
  const double allgather = (p - 1) * alpha + share * n * beta;
  switch (kind) {
    case CollectiveKind::Allreduce: return costStagedHostReduce(cfg, s, bytes, sharedMemory);
    case CollectiveKind::Reduce: return reduceScatter + allgather;  // reduce-scatter, then the slices to the root
    case CollectiveKind::Broadcast:
      // Binomial tree for short vectors, scatter + allgather for long ones.
      return std::min(steps * (alpha + n * beta), steps * alpha + allgather + share * n * beta);
    case CollectiveKind::Allgather: return (p - 1) * alpha + share * (n * p) * beta;
    case CollectiveKind::ReduceScatter: return reduceScatter;
    case CollectiveKind::Gather:
    case CollectiveKind::Scatter: return (p - 1) * (alpha + n * beta);  // the root moves every block
    case CollectiveKind::AllToAll: return (p - 1) * alpha + share * n * beta;
    case CollectiveKind::Barrier: return 2 * steps * alpha;
    case CollectiveKind::PointToPoint: return alpha + n * beta;
  }
  return 0;
}

}  // namespace roce::algorithms
