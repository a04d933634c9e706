#include "rank_info.hpp"

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>

#include "../common/error.hpp"
#include "../common/parse.hpp"
#include "../transport/verbs/port_choice.hpp"  // kMaxRails

namespace roce::membership {
using namespace roce::transport::verbs;

std::string RankInfo::encode() const {
  std::string why = noVerbsWhy;
  for (char& ch : why)
    if (ch == '\n') ch = ' ';
  return str(nodeId, "\n", hostId, "\n", pid, "\n", tcpHost, "\n", tcpPort, "\n", verbsRails, "\n", nonce, "\n",
             shmRingBytes, "\n", shmSlotBytes, "\n", algorithms, "\n", cpus, "\n", why);
}


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
  if (!parseU64(verbs, 0, kMaxRails, v)) bad("verbs port count");
  r.verbsRails = static_cast<int>(v);
  if (!parseU64(nonce, 0, UINT64_MAX, r.nonce)) bad("nonce");
  if (!parseU64(ring, 0, 1ull << 40, r.shmRingBytes) || !parseU64(slot, 0, 1ull << 40, r.shmSlotBytes))
    bad("shared-memory layout");
  if (!parseU64(cpus, 1, 1 << 20, v)) bad("CPU count");
  r.cpus = static_cast<int>(v);
  if (r.nodeId.empty() || r.hostId.empty()) bad("machine identity");
  return r;
}

std::string RankInfo::hostName() const { return hostId.substr(0, hostId.find('/')); }

std::string localHostId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return str(host, "/", boot);
}

}  // namespace roce::membership
