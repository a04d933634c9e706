#include "verbs_device.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "../../common/config.hpp"
#include "../../common/error.hpp"
#include "../../common/log.hpp"

namespace roce {
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

}  // namespace

std::string gidToString(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, g.raw, buf, sizeof(buf));
  return buf;
}

int mtuToBytes(ibv_mtu m) { return 128 << static_cast<int>(m); }

std::optional<VerbsPortChoice> chooseVerbsPort(const Config& cfg, std::string& why) {
  HcaFilter filter = HcaFilter::parse(cfg.ibHca);
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  if (!devs || n == 0) {
    if (devs) ibv_free_device_list(devs);
    why = "libibverbs found no RDMA device (is rdma-core with the provider for your NIC installed, "
          "and the kernel driver loaded? `ibv_devices` lists them)";
    return std::nullopt;
  }
  std::string seen;
  std::optional<VerbsPortChoice> found;
  for (int i = 0; i < n && !found; ++i) {
    const std::string name = ibv_get_device_name(devs[i]);
    ibv_context* ctx = ibv_open_device(devs[i]);
    if (!ctx) { seen += str(" ", name, "(cannot open: ", std::strerror(errno), ")"); continue; }
    ibv_device_attr da{};
    if (ibv_query_device(ctx, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt && !found; ++p) {
        ibv_port_attr pa{};
        if (ibv_query_port(ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
        bool eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        seen += str(" ", name, ":", p, "(", pa.state == IBV_PORT_ACTIVE ? "ACTIVE" : "not active", ", ",
                    eth ? "Ethernet" : "InfiniBand", ")");
        if (!filter.accepts(name, p) || pa.state != IBV_PORT_ACTIVE) continue;
        int gid = 0;
        if (eth) {
          gid = cfg.ibGidIndex >= 0 ? cfg.ibGidIndex : autoGidIndex(ctx, p, pa.gid_tbl_len);
          if (gid < 0 || gid >= pa.gid_tbl_len) {
            seen += "[no usable GID: configure an IP address on the NIC's netdev]";
            continue;
          }
        }
        found = VerbsPortChoice{name, p, gid, eth};
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(devs);
  if (!found)
    why = str("no ACTIVE RDMA port", cfg.ibHca.empty() ? "" : str(" matching ROCE_PG_IB_HCA=", cfg.ibHca),
              "; ports seen:", seen.empty() ? " none" : seen);
  return found;
}

VerbsDevice::VerbsDevice(const VerbsPortChoice& choice, const Config& cfg) : choice_(choice), tc_(cfg.ibTc) {
  // Registered pages must not be shared copy-on-write with forked children
  // (DataLoader workers): tell libibverbs before the first registration.
  static const int forkInit = ibv_fork_init();
  (void)forkInit;
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  for (int i = 0; devs && i < n && !ctx_; ++i)
    if (choice.device == ibv_get_device_name(devs[i])) ctx_ = ibv_open_device(devs[i]);
  if (devs) ibv_free_device_list(devs);
  if (!ctx_) throwComm(str("cannot open RDMA device ", choice.device, ": ", std::strerror(errno)));
  if (ibv_query_device(ctx_, &devAttr_) != 0 || ibv_query_port(ctx_, static_cast<uint8_t>(choice.port), &portAttr_) != 0)
    throwComm(str("cannot query RDMA device ", choice.device, " port ", choice.port));
  if (choice.ethernet && ibv_query_gid(ctx_, static_cast<uint8_t>(choice.port), choice.gidIndex, &gid_) != 0)
    throwComm(str("cannot read GID index ", choice.gidIndex, " of ", choice.device, " port ", choice.port,
                  " (check ROCE_PG_IB_GID_INDEX; `show_gids` lists the table)"));
  pd_ = ibv_alloc_pd(ctx_);
  if (!pd_) throwComm(str("ibv_alloc_pd on ", choice.device, " failed: ", std::strerror(errno)));
  int fl = fcntl(ctx_->async_fd, F_GETFL);
  fcntl(ctx_->async_fd, F_SETFL, fl | O_NONBLOCK);
  asyncThread_ = std::thread([this] { asyncLoop(); });
  ROCE_INFO("verbs: ", describe(), ", max_msg_sz ", portAttr_.max_msg_sz, ", max_qp_wr ", devAttr_.max_qp_wr);
}

VerbsDevice::~VerbsDevice() {
  stop_ = true;
  if (asyncThread_.joinable()) asyncThread_.join();
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
}

std::string VerbsDevice::describe() const {
  if (!choice_.ethernet)
    return str(choice_.device, " port ", choice_.port, " (InfiniBand, LID ", portAttr_.lid, "), MTU ",
               mtuToBytes(portAttr_.active_mtu), ", SL");
  return str(choice_.device, " port ", choice_.port, ", GID index ", choice_.gidIndex, " (", gidToString(gid_),
             "), MTU ", mtuToBytes(portAttr_.active_mtu), ", TC ", tc_);
}

std::string VerbsDevice::asyncError() const {
  std::lock_guard<std::mutex> g(mu_);
  return asyncError_;
}

void VerbsDevice::asyncLoop() {
  while (!stop_) {
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ibv_async_event ev{};
    if (ibv_get_async_event(ctx_, &ev) != 0) continue;
    const auto type = ev.event_type;
    // A port event matters only for the port this group uses (a multi-port NIC
    // reports the others' flaps too).
    const bool ourPort = type != IBV_EVENT_PORT_ERR || ev.element.port_num == choice_.port;
    bool fatal = ourPort && (type == IBV_EVENT_DEVICE_FATAL || type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_CQ_ERR ||
                             type == IBV_EVENT_QP_REQ_ERR || type == IBV_EVENT_QP_ACCESS_ERR || type == IBV_EVENT_PORT_ERR);
    ibv_ack_async_event(&ev);
    if (fatal) {
      std::lock_guard<std::mutex> g(mu_);
      if (asyncError_.empty())
        asyncError_ = str("asynchronous RDMA error on ", describe(), ": ", ibv_event_type_str(type),
                          type == IBV_EVENT_PORT_ERR ? " (the port went down: check the link / cable / switch)" : "");
    }
    ROCE_WARN("verbs async event on ", choice_.device, ": ", ibv_event_type_str(type));
  }
}

ibv_mr* VerbsDevice::registerMemory(void* addr, size_t len, int access, const char* what) {
  ibv_mr* mr = ibv_reg_mr(pd_, addr, len, access);
  if (mr) return mr;
  int err = errno;
  rlimit rl{};
  getrlimit(RLIMIT_MEMLOCK, &rl);
  std::string limit = rl.rlim_cur == RLIM_INFINITY ? "unlimited" : str(rl.rlim_cur / 1024, " KiB");
  throwComm(str("ibv_reg_mr of ", len >> 10, " KiB (", what, ") on ", choice_.device, " failed: ", std::strerror(err),
                ". The locked-memory limit (ulimit -l) is ", limit,
                "; RDMA needs more: run `ulimit -l unlimited`, or in containers `docker run --ulimit memlock=-1`, "
                "or LimitMEMLOCK=infinity for systemd services; or lower ROCE_PG_IB_SLOTS / ROCE_PG_CHUNK_BYTES"));
}

}  // namespace roce
