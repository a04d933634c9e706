#include "roster.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <tuple>

#include "../common/config.hpp"
#include "../common/error.hpp"
#include "../common/fnv.hpp"
#include "../common/parse.hpp"
#include "../transport/verbs/port_choice.hpp"  // kMaxRails
#include "topology.hpp"

namespace roce::membership {
using namespace roce::transport::verbs;

namespace {

constexpr const char* kErrorTag = "error";  // see join.cpp's errorRecord

// Roster fields are separated by tabs and newlines: keep them out of strings
// that come from the environment (hostnames, ROCE_PG_SIM_NODE is checked).
std::string field(std::string s) {
  for (char& ch : s)
    if (ch == '\t' || ch == '\n') ch = '_';
  return s;
}

[[noreturn]] void malformed(const std::string& what) {
  throwComm(str("the group's roster published by rank 0 is malformed (", what,
                "): mixed roce_pg versions across ranks, or another program writing this group's store keys"));
}

// Every rank of a machine must map the same shared-memory layout, or rings
// would overlap and reads run past a peer's segment (SIGBUS).
void checkShmLayouts(const std::vector<RankInfo>& infos) {
  std::map<std::string, size_t> firstOnNode;
  for (size_t r = 0; r < infos.size(); ++r) {
    auto [it, fresh] = firstOnNode.emplace(infos[r].nodeId, r);
    if (fresh) continue;
    const RankInfo& a = infos[it->second];
    const RankInfo& b = infos[r];
    if (a.shmRingBytes != b.shmRingBytes || a.shmSlotBytes != b.shmSlotBytes)
      throwInvalid(str("ranks ", it->second, " and ", r, " on one machine (", b.hostName(), ") use different "
                       "shared-memory layouts (ROCE_PG_SHM_RING_BYTES ", a.shmRingBytes, " vs ", b.shmRingBytes,
                       ", ROCE_PG_SHM_SLOT_BYTES ", a.shmSlotBytes, " vs ", b.shmSlotBytes,
                       "): set the same values on every rank"));
  }
}

// Every rank must pick the same algorithm for the same call, or the message
// patterns would not pair up (a size mismatch at best, a hang until the
// timeout at worst): the settings that decide it must be equal everywhere.
void checkAlgorithmSettings(const std::vector<RankInfo>& infos) {
  for (size_t r = 1; r < infos.size(); ++r)
    if (infos[r].algorithms != infos[0].algorithms)
      throwInvalid(str("ranks 0 and ", r, " use different algorithm settings (rank 0: ", infos[0].algorithms,
                       "; rank ", r, ": ", infos[r].algorithms, "): set the same ROCE_PG_ALGO* and "
                       "ROCE_PG_CHUNK_BYTES, ROCE_PG_NCHANNELS values on every rank"));
}

// ROCE_PG_NCHANNELS, or with it unset ("auto") the smallest count any rank's
// CPUs allow.
int groupChannels(const Config& cfg, const std::vector<RankInfo>& infos, const Topology& topo) {
  if (cfg.algo.nChannels > 0) return cfg.algo.nChannels;
  std::vector<int> ranksOnNode(topo.numNodes, 0);
  for (int node : topo.nodeOf) ranksOnNode[node]++;
  auto wish = [&](size_t r) { return Config::channelsAuto(infos[r].cpus, ranksOnNode[topo.nodeOf[r]]); };
  int channels = wish(0);
  for (size_t r = 1; r < infos.size(); ++r) channels = std::min(channels, wish(r));
  return channels;
}

// "verbs" or "tcp" for the peers not on the same machine, "none" when no rank
// needs the network; throws when the group needs it, verbs was not ruled out,
// and some rank lacks a port.
std::string chooseNetwork(const Config& cfg, const std::vector<RankInfo>& infos, const Topology& topo) {
  const bool needsNet = cfg.placement.forceNetwork ? topo.size > 1 : topo.numNodes > 1;
  if (!needsNet) return "none";
  if (cfg.placement.netTransport == NetTransport::Tcp) return "tcp";
  std::string lacking;
  for (size_t r = 0; r < infos.size(); ++r)
    if (!infos[r].verbs()) lacking += str("\n  rank ", r, ": ", infos[r].noVerbsWhy);
  if (lacking.empty()) return "verbs";
  throwInvalid(str("this group spans ", cfg.placement.forceNetwork ? "the network (ROCE_PG_FORCE_NETWORK=1)" : "several machines",
                   " but not every rank has a usable RDMA port:", lacking,
                   "\nFix the RDMA setup (ibv_devinfo should show an ACTIVE port), or set ROCE_PG_NET_TRANSPORT=tcp "
                   "on every rank to use TCP between machines"));
}

}  // namespace

std::string Roster::encode() const {
  // Machines and addresses repeat for every rank of a machine: a table of
  // places, then a short record per rank.
  std::map<std::tuple<std::string, std::string, std::string>, size_t> placeOf;
  std::vector<const RankInfo*> places;
  std::ostringstream rankLines;
  for (const RankInfo& r : ranks) {
    auto [it, fresh] = placeOf.emplace(std::make_tuple(r.nodeId, r.hostId, r.tcpHost), places.size());
    if (fresh) places.push_back(&r);
    rankLines << "R " << it->second << " " << r.pid << " " << r.tcpPort << " " << r.nonce << " " << r.cpus << " "
              << r.verbsRails << "\n";
  }
  std::ostringstream os;
  os << "roster 1 " << ranks.size() << " " << network << " " << (forceNetwork ? 1 : 0) << " " << channels << " "
     << places.size() << "\n";
  for (const RankInfo* p : places) os << "P " << field(p->nodeId) << "\t" << field(p->hostId) << "\t" << field(p->tcpHost) << "\n";
  os << rankLines.str();
  return os.str();
}

Roster Roster::decode(const std::string& text, int size) {
  std::istringstream in(text);
  std::string line;
  Roster r;
  auto words = [](const std::string& s) {
    std::vector<std::string> w;
    std::istringstream ws(s);
    for (std::string x; ws >> x;) w.push_back(x);
    return w;
  };
  uint64_t v = 0, places = 0, n = 0;
  if (!std::getline(in, line)) malformed("empty");
  auto head = words(line);
  if (head.size() != 7 || head[0] != "roster" || head[1] != "1") malformed("header");
  if (!parseU64(head[2], 1, 1 << 24, n) || n != static_cast<uint64_t>(size)) malformed("rank count");
  r.network = head[3];
  if (r.network != "none" && r.network != "tcp" && r.network != "verbs") malformed("network transport");
  if (head[4] != "0" && head[4] != "1") malformed("force flag");
  r.forceNetwork = head[4] == "1";
  if (!parseU64(head[5], 1, Config::Algorithms::kMaxChannels, v)) malformed("channel count");
  r.channels = static_cast<int>(v);
  if (!parseU64(head[6], 1, n, places)) malformed("place count");
  std::vector<RankInfo> table(places);
  for (auto& p : table) {
    if (!std::getline(in, line) || line.rfind("P ", 0) != 0) malformed("place line");
    std::istringstream ps(line.substr(2));
    if (!std::getline(ps, p.nodeId, '\t') || !std::getline(ps, p.hostId, '\t') || !std::getline(ps, p.tcpHost))
      malformed("place fields");
    if (p.nodeId.empty() || p.hostId.empty()) malformed("machine identity");
    if (p.tcpHost.find('\t') != std::string::npos) malformed("place fields");  // encode() never writes one
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (!std::getline(in, line)) malformed("missing ranks");
    auto w = words(line);
    uint64_t place = 0, pid = 0, port = 0, cpus = 0, rails = 0;
    RankInfo info;
    if (w.size() != 7 || w[0] != "R" || !parseU64(w[1], 0, places - 1, place) || !parseU64(w[2], 1, INT32_MAX, pid) ||
        !parseU64(w[3], 0, 65535, port) || !parseU64(w[4], 0, UINT64_MAX, info.nonce) ||
        !parseU64(w[5], 1, 1 << 20, cpus) || !parseU64(w[6], 0, kMaxRails, rails))
      malformed(str("rank ", i));
    info.nodeId = table[place].nodeId;
    info.hostId = table[place].hostId;
    info.tcpHost = table[place].tcpHost;
    info.pid = static_cast<int>(pid);
    info.tcpPort = static_cast<int>(port);
    info.cpus = static_cast<int>(cpus);
    info.verbsRails = static_cast<int>(rails);
    r.ranks.push_back(std::move(info));
  }
  return r;
}

Roster planGroup(const Config& leaderCfg, const std::vector<RankInfo>& infos) {
  checkAlgorithmSettings(infos);
  checkShmLayouts(infos);
  const Topology topo = Topology::build(0, infos);
  Roster r;
  r.ranks = infos;
  r.network = chooseNetwork(leaderCfg, infos, topo);
  r.forceNetwork = leaderCfg.placement.forceNetwork;
  r.channels = groupChannels(leaderCfg, infos, topo);
  return r;
}

Roster Roster::decodeOrThrow(const std::string& text, int size) {
  if (text.rfind(kErrorTag, 0) == 0) {
    const size_t nl = text.find('\n');
    uint64_t kind = 0;
    if (nl == std::string::npos || !parseU64(text.substr(6, nl - 6), 0, 3, kind)) malformed("error record");
    throw Error(static_cast<ErrorKind>(kind), text.substr(nl + 1));
  }
  return decode(text, size);
}

uint64_t derivedNonce(uint64_t parentNonce, const std::string& groupName) {
  // FNV-1a of the name, then splitmix64 of the mix: every rank computes the
  // same value, and nobody can tell one group's keys from another's without
  // the parent's (random) nonces.
  uint64_t z = parentNonce ^ fnv1a64(groupName);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Roster deriveRoster(const Config& cfg, const Roster& parent, const std::vector<int>& parentRanks,
                    const std::string& groupName) {
  Roster r;
  for (int p : parentRanks) {
    if (p < 0 || p >= static_cast<int>(parent.ranks.size()))
      throwInvalid(str("subgroup rank ", p, " is not a rank of the parent group (", parent.ranks.size(), " ranks)"));
    RankInfo info = parent.ranks[p];
    info.nonce = derivedNonce(info.nonce, groupName);
    r.ranks.push_back(std::move(info));
  }
  const Topology topo = Topology::build(0, r.ranks);
  r.forceNetwork = parent.forceNetwork;
  const bool needsNet = r.forceNetwork ? topo.size > 1 : topo.numNodes > 1;
  r.network = needsNet ? parent.network : "none";
  r.channels = groupChannels(cfg, r.ranks, topo);
  return r;
}

}  // namespace roce::membership
