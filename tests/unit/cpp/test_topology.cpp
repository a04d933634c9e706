// Which ranks share a machine (csrc/membership/topology.*): node numbering by
// first appearance, the node-sorted ring order, local indices and the
// hierarchical teams, on hand-worked layouts and on pseudo-random ones
// against a brute-force derivation written here.
#include <algorithm>
#include <string>
#include <vector>

#include "membership/topology.hpp"
#include "roce_check.hpp"

using roce::membership::RankInfo;
using roce::membership::Topology;

namespace {

std::vector<RankInfo> onNodes(const std::vector<std::string>& nodes) {
  std::vector<RankInfo> infos;
  for (const std::string& n : nodes) {
    RankInfo r;
    r.nodeId = n;
    r.hostId = n + "/boot";
    infos.push_back(r);
  }
  return infos;
}

using V = std::vector<int>;

}  // namespace

TEST(uneven_nodes_numbered_by_first_appearance) {
  // Ranks 0..5 on machines B A B C A B; seen from rank 2.
  const Topology t = Topology::build(2, onNodes({"B", "A", "B", "C", "A", "B"}));
  CHECK_EQ(t.rank, 2);
  CHECK_EQ(t.size, 6);
  CHECK_EQ(t.numNodes, 3);
  CHECK((t.nodeOf == V{0, 1, 0, 2, 1, 0}));
  CHECK((t.localRanks == V{0, 2, 5}));
  CHECK_EQ(t.localIndex, 1);
  CHECK((t.ringOrder == V{0, 2, 5, 1, 4, 3}));
  CHECK((t.ringIndexOf == V{0, 3, 1, 5, 4, 2}));
  CHECK((t.localIndexOf == V{0, 0, 1, 0, 1, 2}));
  CHECK((t.nodeRanks == std::vector<V>{{0, 2, 5}, {1, 4}, {3}}));
  CHECK(!t.evenNodes);
  CHECK(t.sameLocalIndex.empty());
  CHECK(!t.allLocal());
}

TEST(even_nodes_give_the_hierarchical_team) {
  // Two machines, interleaved: x y x y x y; seen from rank 3 (y, local index 1).
  const Topology t = Topology::build(3, onNodes({"x", "y", "x", "y", "x", "y"}));
  CHECK_EQ(t.numNodes, 2);
  CHECK((t.localRanks == V{1, 3, 5}));
  CHECK_EQ(t.localIndex, 1);
  CHECK((t.ringOrder == V{0, 2, 4, 1, 3, 5}));
  CHECK(t.evenNodes);
  CHECK((t.sameLocalIndex == V{2, 3}));  // local index 1 on x, then on y
}

TEST(one_machine_and_one_rank) {
  const Topology one = Topology::build(0, onNodes({"solo"}));
  CHECK(one.allLocal());
  CHECK(one.evenNodes);
  CHECK((one.ringOrder == V{0}));
  CHECK((one.sameLocalIndex == V{0}));
  const Topology four = Topology::build(3, onNodes({"m", "m", "m", "m"}));
  CHECK(four.allLocal());
  CHECK((four.localRanks == V{0, 1, 2, 3}));
  CHECK_EQ(four.localIndex, 3);
  CHECK((four.ringOrder == V{0, 1, 2, 3}));
  CHECK((four.sameLocalIndex == V{3}));
}

TEST(node_identity_is_the_node_id_not_the_host) {
  // Simulated machines (ROCE_PG_SIM_*) share a host but not a node id.
  std::vector<RankInfo> infos = onNodes({"sim0", "sim1", "sim0", "sim1"});
  for (RankInfo& r : infos) r.hostId = "host/boot";
  const Topology t = Topology::build(0, infos);
  CHECK_EQ(t.numNodes, 2);
  CHECK((t.localRanks == V{0, 2}));
}

TEST(random_layouts_against_brute_force) {
  uint64_t s = 12345;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>(s >> 33);
  };
  for (int trial = 0; trial < 200; ++trial) {
    const int size = 1 + next() % 24, machines = 1 + next() % 5;
    std::vector<std::string> nodes;
    for (int r = 0; r < size; ++r) nodes.push_back("n" + std::to_string(next() % machines));
    const int rank = next() % size;
    INFO("trial ", trial, " size ", size, " rank ", rank);
    const Topology t = Topology::build(rank, onNodes(nodes));
    // Node index: the order of first appearance.
    std::vector<std::string> seen;
    V nodeOf;
    for (const std::string& n : nodes) {
      auto it = std::find(seen.begin(), seen.end(), n);
      if (it == seen.end()) it = seen.insert(seen.end(), n);
      nodeOf.push_back(static_cast<int>(it - seen.begin()));
    }
    REQUIRE((t.nodeOf == nodeOf));
    CHECK_EQ(t.numNodes, static_cast<int>(seen.size()));
    V ring(size);
    for (int r = 0; r < size; ++r) ring[r] = r;
    std::sort(ring.begin(), ring.end(), [&](int a, int b) { return std::pair(nodeOf[a], a) < std::pair(nodeOf[b], b); });
    CHECK((t.ringOrder == ring));
    for (int q = 0; q < size; ++q) CHECK_EQ(t.ringIndexOf[ring[q]], q);
    V local;
    for (int r = 0; r < size; ++r)
      if (nodeOf[r] == nodeOf[rank]) local.push_back(r);
    CHECK((t.localRanks == local));
    CHECK_EQ(t.localRanks[t.localIndex], rank);
    bool even = true;
    for (const V& ranks : t.nodeRanks) even &= ranks.size() == t.nodeRanks[0].size();
    CHECK_EQ(t.evenNodes, even);
    for (int r = 0; r < size; ++r) CHECK_EQ(t.nodeRanks[nodeOf[r]][t.localIndexOf[r]], r);
    if (even) {
      REQUIRE_EQ(t.sameLocalIndex.size(), seen.size());
      for (size_t n = 0; n < seen.size(); ++n) {
        CHECK_EQ(nodeOf[t.sameLocalIndex[n]], static_cast<int>(n));
        CHECK_EQ(t.localIndexOf[t.sameLocalIndex[n]], t.localIndex);
      }
    }
  }
}
