// Which ranks share a machine, learned at init through the store. A "node" is
// a machine (boot id + hostname), or a simulated one when
// ROCE_PG_SIM_RANKS_PER_NODE splits one host into several for tests.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace roce {

struct RankInfo {
  std::string nodeId;   // machine identity used for placement (may be simulated)
  std::string hostId;   // real machine identity: same hostId => loopback works
  int pid = 0;
  std::string tcpHost;
  int tcpPort = 0;
  bool verbs = false;     // has a usable RDMA port for this group
  std::string noVerbsWhy; // otherwise, what was looked for (one line)
  uint64_t nonce = 0;     // random per rank and group incarnation: TCP hellos must carry it
  // Shared-memory layout this rank would use: every rank of a machine must agree.
  uint64_t shmRingBytes = 0, shmSlotBytes = 0;
  // Algorithm choice and message chunking (Config::algorithmSettings()): every
  // rank must agree, or the ranks would run different message patterns.
  std::string algorithms;
  // Config::usableCpus(): with ROCE_PG_NCHANNELS unset every rank derives the
  // group's channel count from all ranks' CPUs, so all agree (see Communicator).
  int cpus = 1;

  // The hostname part of hostId, for messages.
  std::string hostName() const;

  std::string encode() const;
  // Throws (naming `rank`) on anything malformed: values from the store are not trusted.
  static RankInfo decode(const std::string& s, int rank);
};

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

// Real machine identity of this process: hostname plus kernel boot id (hostnames
// repeat across containers and VMs; boot ids do not).
std::string localHostId();

}  // namespace roce
