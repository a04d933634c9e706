#include "port_choice.hpp"

#include <cstdint>
#include <infiniband/verbs.h>
#include <sched.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../../common/config.hpp"
#include "../../common/log.hpp"

namespace roce::transport::verbs {
namespace {

struct HcaFilter {
  bool exclude = false;
  bool exact = false;
  struct Item { std::string name; int port = 0; };  // port 0 = any
  std::vector<Item> items;

  static HcaFilter parse(const std::string& spec) {
    HcaFilter f;
    std::string s = spec;
    if (!s.empty() && s[0] == '^') { f.exclude = true; s = s.substr(1); }
    if (!s.empty() && s[0] == '=') { f.exact = true; s = s.substr(1); }
    std::stringstream in(s);
    std::string tok;
    while (std::getline(in, tok, ',')) {
      if (tok.empty()) continue;
      Item it;
      auto colon = tok.find(':');
      it.name = tok.substr(0, colon);
      if (colon != std::string::npos) it.port = std::atoi(tok.c_str() + colon + 1);
      f.items.push_back(it);
    }
    return f;
  }
  bool accepts(const std::string& dev, int port) const {
    if (items.empty()) return true;
    bool listed = false;
    for (const auto& it : items) {
      bool nameOk = exact ? dev == it.name : dev.rfind(it.name, 0) == 0;
      if (nameOk && (it.port == 0 || it.port == port)) listed = true;
    }
    return exclude ? !listed : listed;
  }
};

bool isIpv4Mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, 12) == 0;
}

bool isZero(const ibv_gid& g) {
  for (uint8_t b : g.raw) if (b) return false;
  return true;
}

// Auto GID choice on a RoCE port: RoCE v2 + IPv4-mapped first (routable, what
// NICs configured for RoCE v2 use), then any RoCE v2, then anything non-zero.
int autoGidIndex(ibv_context* ctx, int port, int tableLen) {
  int best = -1, bestScore = -1;
  for (int i = 0; i < tableLen; ++i) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx, static_cast<uint32_t>(port), static_cast<uint32_t>(i), &e, 0) != 0) continue;
    ibv_gid g;
    std::memcpy(g.raw, e.gid.raw, 16);
    if (isZero(g)) continue;
    bool v2 = e.gid_type == IBV_GID_TYPE_ROCE_V2;
    int score = (v2 ? 2 : 0) + (isIpv4Mapped(g) ? 1 : 0);
    if (score > bestScore) { bestScore = score; best = i; }
  }
  return best;
}

int readInt(const std::string& path, int fallback) {
  std::ifstream in(path);
  int v = fallback;
  return in >> v ? v : fallback;
}

}  // namespace

std::set<int> parseCpuList(const std::string& text) {
  std::set<int> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    char* end = nullptr;
    const long lo = std::strtol(part.c_str(), &end, 10);
    if (end == part.c_str() || lo < 0) continue;
    long hi = lo;
    if (*end == '-') {
      char* end2 = nullptr;
      hi = std::strtol(end + 1, &end2, 10);
      if (end2 == end + 1 || hi < lo || hi - lo > 1 << 16) continue;
    }
    for (long c = lo; c <= hi; ++c) out.insert(static_cast<int>(c));
  }
  return out;
}

std::set<int> processNumaNodes() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  std::set<int> nodes;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = entry.path().filename();
    if (name.rfind("node", 0) != 0 || name.size() == 4) continue;
    const int node = std::atoi(name.c_str() + 4);
    std::ifstream in(entry.path() / "cpulist");
    std::string list;
    std::getline(in, list);
    for (int cpu : parseCpuList(list))
      if (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &set)) {
        nodes.insert(node);
        break;
      }
  }
  return nodes;
}

std::vector<size_t> nearestPorts(const std::vector<int>& portNodes, const std::set<int>& rankNodes) {
  std::vector<size_t> all, near;
  std::set<int> known;  // nodes that have a port
  for (size_t i = 0; i < portNodes.size(); ++i) {
    all.push_back(i);
    if (portNodes[i] >= 0) known.insert(portNodes[i]);
    if (portNodes[i] >= 0 && rankNodes.count(portNodes[i])) near.push_back(i);
  }
  // A rank not pinned to a subset of the nodes with ports is near all of them.
  bool pinned = false;
  for (int n : known)
    if (!rankNodes.count(n)) pinned = true;
  return pinned && !near.empty() && !rankNodes.empty() ? near : all;
}

namespace {
std::vector<std::string> pathParts(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream in(path);
  std::string part;
  while (std::getline(in, part, '/'))
    if (!part.empty()) parts.push_back(part);
  return parts;
}
}  // namespace

int pciDistance(const std::string& a, const std::string& b) {
  const auto pa = pathParts(a), pb = pathParts(b);
  // sys / devices / pciDDDD:BB / ...: below the root complex or nothing in common
  if (pa.size() < 4 || pb.size() < 4 || pa[0] != "sys" || pb[0] != "sys" || pa[2] != pb[2] ||
      pa[2].rfind("pci", 0) != 0)
    return kPciFar;
  size_t common = 0;
  while (common < pa.size() && common < pb.size() && pa[common] == pb[common]) ++common;
  return static_cast<int>((pa.size() - common) + (pb.size() - common));
}

std::vector<size_t> nearestToDevice(const std::vector<std::string>& nicPaths, const std::string& device) {
  std::vector<size_t> best;
  int bestDistance = kPciFar;
  for (size_t i = 0; i < nicPaths.size(); ++i) {
    const int d = pciDistance(nicPaths[i], device);
    if (d >= kPciFar) continue;
    if (d < bestDistance) bestDistance = d, best.clear();
    if (d == bestDistance) best.push_back(i);
  }
  return best;
}

std::vector<size_t> capRails(const std::vector<size_t>& ports, int rank) {
  if (ports.size() <= static_cast<size_t>(kMaxRails)) return ports;
  std::vector<size_t> out;
  const size_t start = static_cast<size_t>(std::max(rank, 0)) % ports.size();
  for (size_t i = 0; i < static_cast<size_t>(kMaxRails); ++i) out.push_back(ports[(start + i) % ports.size()]);
  return out;
}

int gidIndexFor(const Config& cfg, ibv_context* ctx, int port, int tableLen) {
  const int gid = cfg.verbs.gidIndex >= 0 ? cfg.verbs.gidIndex : autoGidIndex(ctx, port, tableLen);
  return gid >= 0 && gid < tableLen ? gid : -1;
}

std::vector<VerbsPortChoice> chooseVerbsPorts(const Config& cfg, int rank, std::string& why) {
  HcaFilter filter = HcaFilter::parse(cfg.verbs.hca);
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  if (!devs || n == 0) {
    if (devs) ibv_free_device_list(devs);
    why = "libibverbs found no RDMA device (is rdma-core with the provider for your NIC installed, "
          "and the kernel driver loaded? `ibv_devices` lists them)";
    return {};
  }
  std::string seen;
  std::vector<VerbsPortChoice> usable;
  for (int i = 0; i < n; ++i) {
    const std::string name = ibv_get_device_name(devs[i]);
    ibv_context* ctx = ibv_open_device(devs[i]);
    if (!ctx) { seen += str(" ", name, "(cannot open: ", std::strerror(errno), ")"); continue; }
    const int node = readInt(str("/sys/class/infiniband/", name, "/device/numa_node"), -1);
    std::error_code ec;
    const auto pci = std::filesystem::canonical(str("/sys/class/infiniband/", name, "/device"), ec);
    ibv_device_attr da{};
    if (ibv_query_device(ctx, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (ibv_query_port(ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
        bool eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        seen += str(" ", name, ":", p, "(", pa.state == IBV_PORT_ACTIVE ? "ACTIVE" : "not active", ", ",
                    eth ? "Ethernet" : "InfiniBand", ")");
        if (!filter.accepts(name, p) || pa.state != IBV_PORT_ACTIVE) continue;
        // One addressing scheme per rank: the first usable port's.
        if (!usable.empty() && usable.front().ethernet != eth) {
          seen += "[other link layer than the first port: not used]";
          continue;
        }
        int gid = 0;
        if (eth) {
          gid = gidIndexFor(cfg, ctx, p, pa.gid_tbl_len);
          if (gid < 0) {
            seen += "[no usable GID: configure an IP address on the NIC's netdev]";
            continue;
          }
        }
        usable.push_back(VerbsPortChoice{name, p, gid, eth, node, ec ? std::string() : pci.string()});
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(devs);
  if (usable.empty()) {
    why = str("no ACTIVE RDMA port", cfg.verbs.hca.empty() ? "" : str(" matching ROCE_PG_IB_HCA=", cfg.verbs.hca),
              "; ports seen:", seen.empty() ? " none" : seen);
    return {};
  }
  std::vector<size_t> picked;
  if (cfg.verbs.hca.empty()) {
    std::vector<std::string> paths;
    for (const auto& c : usable) paths.push_back(c.pciPath);
    if (!cfg.verbs.nearDevicePci.empty()) picked = nearestToDevice(paths, cfg.verbs.nearDevicePci);
    if (picked.empty()) {  // no GPU, or no NIC on its root complex: by NUMA node
      std::vector<int> nodes;
      for (const auto& c : usable) nodes.push_back(c.numaNode);
      picked = nearestPorts(nodes, processNumaNodes());
    }
  } else {
    for (size_t i = 0; i < usable.size(); ++i) picked.push_back(i);
  }
  std::vector<VerbsPortChoice> out;
  for (size_t i : capRails(picked, rank)) out.push_back(usable[i]);
  if (picked.size() > out.size())
    ROCE_INFO("rank ", rank, ": ", picked.size(), " RDMA ports qualify; a rank drives at most ", kMaxRails,
              ", starting at ", out.front().device, ":", out.front().port, " (set ROCE_PG_IB_HCA to choose)");
  return out;
}

}  // namespace roce::transport::verbs
