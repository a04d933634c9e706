#include "topology.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <cstdint>
#include <sstream>

#include "../common/error.hpp"

namespace roce {

std::string RankInfo::encode() const {
  std::string why = noVerbsWhy;
  for (char& ch : why)
    if (ch == '\n') ch = ' ';
  return str(nodeId, "\n", hostId, "\n", pid, "\n", tcpHost, "\n", tcpPort, "\n", verbs ? 1 : 0, "\n", nonce, "\n",
             shmRingBytes, "\n", shmSlotBytes, "\n", algorithms, "\n", cpus, "\n", why);
}

namespace {
// Strict unsigned decimal in [lo, hi]; std::stoi would accept "12abc" and throw
// the wrong exception type on garbage.
bool parseU64(const std::string& s, uint64_t lo, uint64_t hi, uint64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    uint64_t d = static_cast<uint64_t>(ch - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  if (v < lo || v > hi) return false;
  out = v;
  return true;
}
}  // namespace

RankInfo RankInfo::decode(const std::string& s, int rank) {
  std::istringstream in(s);
  RankInfo r;
  std::string pid, port, verbs, nonce, ring, slot, cpus;
  uint64_t v = 0;
  auto bad = [&](const char* what) {
    throwComm(str("rank ", rank, " published malformed rank info in the store (", what,
                  "): mixed roce_pg versions across ranks, or another program writing this group's keys"));
  };
  if (!std::getline(in, r.nodeId) || !std::getline(in, r.hostId) || !std::getline(in, pid) ||
      !std::getline(in, r.tcpHost) || !std::getline(in, port) || !std::getline(in, verbs) || !std::getline(in, nonce) ||
      !std::getline(in, ring) || !std::getline(in, slot) || !std::getline(in, r.algorithms) ||
      !std::getline(in, cpus))
    bad("missing fields");
  std::getline(in, r.noVerbsWhy);
  if (!parseU64(pid, 1, INT32_MAX, v)) bad("pid");
  r.pid = static_cast<int>(v);
  if (!parseU64(port, 0, 65535, v)) bad("TCP port");
  r.tcpPort = static_cast<int>(v);
  if (verbs != "0" && verbs != "1") bad("verbs flag");
  r.verbs = verbs == "1";
  if (!parseU64(nonce, 0, UINT64_MAX, r.nonce)) bad("nonce");
  if (!parseU64(ring, 0, 1ull << 40, r.shmRingBytes) || !parseU64(slot, 0, 1ull << 40, r.shmSlotBytes))
    bad("shared-memory layout");
  if (!parseU64(cpus, 1, 1 << 20, v)) bad("CPU count");
  r.cpus = static_cast<int>(v);
  if (r.nodeId.empty() || r.hostId.empty()) bad("machine identity");
  return r;
}

std::string RankInfo::hostName() const { return hostId.substr(0, hostId.find('/')); }

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

std::string localHostId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return str(host, "/", boot);
}

}  // namespace roce
