// Hierarchical (2-D) allreduce for groups of several machines with L ranks
// each: reduce-scatter inside the machine (L shards), allreduce of shard i
// across machines among the ranks with local index i (L independent
// allreduces at once, so every machine's ranks use the network together and
// each carries 1/L of the vector), allgather inside the machine.
// Network bytes per rank: 2(N-1)/N * n/L for N machines with the ring across
// (flat ring: up to 2(p-1)/p * n on the ranks at machine boundaries).
// Requires the same L on every machine (select.cpp falls back otherwise).
#include "../comm/communicator.hpp"
#include "algorithms.hpp"
#include "recursive.hpp"
#include "ring.hpp"
#include "select.hpp"

namespace roce::detail {

void hierAllreduce(Communicator& c, uint64_t tag, void* data, size_t count, DataType t, ReduceOp op) {
  const Topology& topo = c.topology();
  const size_t esz = elementSize(t);
  // The ranks holding the same shard: local index i on every machine, machines in order.
  std::vector<std::vector<int>> byNode(topo.numNodes);
  for (int r = 0; r < topo.size; ++r) byNode[topo.nodeOf[r]].push_back(r);
  std::vector<int> across;
  for (const auto& ranks : byNode) across.push_back(ranks.at(topo.localIndex));
  const Team acrossTeam(across, c.rank());

  const RingSegments shards = RingSegments::even(count, static_cast<int>(topo.localRanks.size()));
  ringReduceScatter(c, topo.localRanks, tag, data, shards, t, op);
  char* shard = static_cast<char*>(data) + shards.offset[topo.localIndex] * esz;
  const size_t n = shards.count[topo.localIndex];
  switch (chooseFlatAllreduce(c, n * esz, acrossTeam)) {
    case Algo::Rd: recursiveDoublingAllreduce(c, acrossTeam, tag, shard, n, t, op); break;
    case Algo::Rabenseifner: rabenseifnerAllreduce(c, acrossTeam, tag, shard, n, t, op); break;
    default: ringAllreduce(c, across, tag, shard, n, t, op); break;
  }
  ringAllgather(c, topo.localRanks, tag, data, shards, esz);
}

}  // namespace roce::detail
