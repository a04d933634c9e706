// Which ranks share a machine, learned at init through the store. A "node" is
// a machine (boot id + hostname), or a simulated one when
// ROCE_PG_SIM_RANKS_PER_NODE splits one host into several for tests.
#pragma once
#include <string>
#include <vector>

#include "rank_info.hpp"

namespace roce::membership {

struct Topology {
  int rank = 0;
  int size = 1;
  int numNodes = 1;
  std::vector<int> nodeOf;      // node index of each rank, numbered by first appearance
  std::vector<int> localRanks;  // ranks on this rank's node, ascending
  int localIndex = 0;           // position of `rank` in localRanks
  std::vector<int> ringOrder;   // ranks ordered by (node, rank): two ring edges per node pair
  std::vector<int> ringIndexOf;  // position of each rank in ringOrder
  std::vector<int> localIndexOf; // position of each rank among its node's ranks
  std::vector<std::vector<int>> nodeRanks;  // ranks of each node, ascending
  bool evenNodes = true;        // every node has the same number of ranks
  // With evenNodes: the rank with this rank's local index on each node, nodes
  // in order (the team that shares one shard in the hierarchical algorithms).
  std::vector<int> sameLocalIndex;

  static Topology build(int rank, const std::vector<RankInfo>& infos);
  bool allLocal() const { return numNodes == 1; }
};

}  // namespace roce::membership
