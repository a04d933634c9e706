#include "topology.hpp"

#include <algorithm>
#include <map>

namespace roce::membership {

Topology Topology::build(int rank, const std::vector<RankInfo>& infos) {
  Topology t;
  t.rank = rank;
  t.size = static_cast<int>(infos.size());
  std::map<std::string, int> index;
  for (const auto& info : infos) {
    auto [it, fresh] = index.emplace(info.nodeId, static_cast<int>(index.size()));
    t.nodeOf.push_back(it->second);
  }
  t.numNodes = static_cast<int>(index.size());
  for (int r = 0; r < t.size; ++r)
    if (t.nodeOf[r] == t.nodeOf[rank]) t.localRanks.push_back(r);
  t.localIndex = static_cast<int>(std::find(t.localRanks.begin(), t.localRanks.end(), rank) - t.localRanks.begin());
  for (int r = 0; r < t.size; ++r) t.ringOrder.push_back(r);
  std::stable_sort(t.ringOrder.begin(), t.ringOrder.end(),
                   [&](int a, int b) { return t.nodeOf[a] < t.nodeOf[b]; });
  t.ringIndexOf.assign(t.size, 0);
  for (int q = 0; q < t.size; ++q) t.ringIndexOf[t.ringOrder[q]] = q;
  t.nodeRanks.assign(t.numNodes, {});
  t.localIndexOf.assign(t.size, 0);
  for (int r = 0; r < t.size; ++r) {
    t.localIndexOf[r] = static_cast<int>(t.nodeRanks[t.nodeOf[r]].size());
    t.nodeRanks[t.nodeOf[r]].push_back(r);
  }
  t.evenNodes = std::all_of(t.nodeRanks.begin(), t.nodeRanks.end(),
                            [&](const std::vector<int>& v) { return v.size() == t.nodeRanks[0].size(); });
  if (t.evenNodes)
    for (const auto& ranks : t.nodeRanks) t.sameLocalIndex.push_back(ranks[t.localIndex]);
  return t;
}

}  // namespace roce::membership
