// Hierarchical (2-D) collectives for groups of several machines with L ranks
// each (Topology::evenNodes; select.cpp falls back to the flat algorithms
// otherwise). Shard i of the data belongs to the ranks with local index i: the
// machine-local phases run over shared memory among one machine's ranks, the
// network phase among the N ranks sharing a local index, so all L ranks of a
// machine use the network at once and each carries 1/L of the traffic.
//
// Network bytes per rank (n = the whole vector per rank, N machines):
//   allreduce       2(N-1)/N * n/L   (flat ring: up to 2(p-1)/p * n on the
//                                     ranks at machine boundaries)
//   reduce-scatter  (N-1)/N * n/L    (flat ring: up to (p-1)/p * n)
//   allgather       (N-1)/N * n/L    (flat ring: up to (p-1)/p * n)
#include <algorithm>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "algorithms.hpp"
#include "recursive.hpp"
#include "ring.hpp"
#include "select.hpp"

namespace roce::detail {
namespace {

// Positions 0..n-1, position q at q * stride, `count` each.
RingSegments strided(int n, size_t stride, size_t count) {
  RingSegments s;
  for (int q = 0; q < n; ++q) {
    s.offset.push_back(static_cast<size_t>(q) * stride);
    s.count.push_back(count);
  }
  return s;
}

}  // namespace

void hierAllreduce(Communicator& c, uint64_t tag, void* data, size_t count, DataType t, ReduceOp op) {
  const Topology& topo = c.topology();
  const size_t esz = elementSize(t);
  const Team across(topo.sameLocalIndex, c.rank());

  const RingSegments shards = RingSegments::even(count, static_cast<int>(topo.localRanks.size()));
  ringReduceScatter(c, topo.localRanks, tag, data, shards, t, op);
  char* shard = static_cast<char*>(data) + shards.offset[topo.localIndex] * esz;
  const size_t n = shards.count[topo.localIndex];
  switch (chooseFlatAllreduce(c, n * esz, across)) {
    case Algo::Rd: recursiveDoublingAllreduce(c, across, tag, shard, n, t, op); break;
    case Algo::Rabenseifner: rabenseifnerAllreduce(c, across, tag, shard, n, t, op); break;
    default: ringAllreduce(c, across.ranks, tag, shard, n, t, op); break;
  }
  ringAllgather(c, topo.localRanks, tag, data, shards, esz);
}

size_t hierBlockIndex(const Topology& topo, int rank) {
  const size_t nodes = static_cast<size_t>(topo.numNodes);
  const int node = topo.nodeOf[rank];
  const auto& ranks = topo.nodeRanks[node];
  const size_t local = static_cast<size_t>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
  return local * nodes + static_cast<size_t>(node);
}

char* hierReduceScatter(Communicator& c, uint64_t tag, void* work, size_t blockCount, DataType t, ReduceOp op) {
  const Topology& topo = c.topology();
  const size_t esz = elementSize(t), nodes = static_cast<size_t>(topo.numNodes);
  const int local = static_cast<int>(topo.localRanks.size());
  // Inside the machine: local index q ends with the machine's sum of shard q.
  ringReduceScatter(c, topo.localRanks, tag, work, strided(local, nodes * blockCount, nodes * blockCount), t, op);
  // Across machines: the node-m rank of the shard's team ends with block m.
  char* shard = static_cast<char*>(work) + static_cast<size_t>(topo.localIndex) * nodes * blockCount * esz;
  ringReduceScatter(c, topo.sameLocalIndex, tag, shard, strided(topo.numNodes, blockCount, blockCount), t, op);
  return shard + static_cast<size_t>(topo.nodeOf[c.rank()]) * blockCount * esz;
}

void hierAllgather(Communicator& c, uint64_t tag, const void* input, void* output, size_t blockBytes) {
  const Topology& topo = c.topology();
  const size_t nodes = static_cast<size_t>(topo.numNodes), bundle = nodes * blockBytes;
  const int local = static_cast<int>(topo.localRanks.size());
  // Bundle q (local index q's blocks from every machine, machines in order).
  char* work = static_cast<char*>(c.scratch(static_cast<size_t>(local) * bundle, 2));
  char* mine = work + static_cast<size_t>(topo.localIndex) * bundle;
  copyBytes(mine + static_cast<size_t>(topo.nodeOf[c.rank()]) * blockBytes, input, blockBytes);
  ringAllgather(c, topo.sameLocalIndex, tag, mine, strided(topo.numNodes, blockBytes, blockBytes), 1);
  ringAllgather(c, topo.localRanks, tag, work, strided(local, bundle, bundle), 1);
  char* out = static_cast<char*>(output);
  for (int m = 0; m < topo.numNodes; ++m)
    for (int q = 0; q < local; ++q)
      copyBytes(out + static_cast<size_t>(topo.nodeRanks[m][q]) * blockBytes,
                work + static_cast<size_t>(q) * bundle + static_cast<size_t>(m) * blockBytes, blockBytes);
}

}  // namespace roce::detail
