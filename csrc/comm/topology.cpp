#include "topology.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "../common/error.hpp"

namespace roce {

std::string RankInfo::encode() const {
  std::string why = noVerbsWhy;
  for (char& ch : why)
    if (ch == '\n') ch = ' ';
  return str(nodeId, "\n", hostId, "\n", pid, "\n", tcpHost, "\n", tcpPort, "\n", verbs ? 1 : 0, "\n", why);
}

RankInfo RankInfo::decode(const std::string& s) {
  std::istringstream in(s);
  RankInfo r;
  std::string pid, port, verbs;
  if (!std::getline(in, r.nodeId) || !std::getline(in, r.hostId) || !std::getline(in, pid) ||
      !std::getline(in, r.tcpHost) || !std::getline(in, port) || !std::getline(in, verbs))
    throwComm("malformed rank info in the store (mixed roce_pg versions across ranks?)");
  std::getline(in, r.noVerbsWhy);
  r.pid = std::stoi(pid);
  r.tcpPort = std::stoi(port);
  r.verbs = verbs == "1";
  return r;
}

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
  return t;
}

std::string localHostId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return str(host, "/", boot);
}

}  // namespace roce
