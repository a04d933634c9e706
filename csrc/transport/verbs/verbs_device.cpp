#include "verbs_device.hpp"

#include <arpa/inet.h>
#include <cstdint>
#include <fcntl.h>
#include <unistd.h>
#include <poll.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "../../common/config.hpp"
#include "../../common/error.hpp"
#include "../../common/log.hpp"
#include "cq_set.hpp"

namespace roce::transport::verbs {

std::string gidToString(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, g.raw, buf, sizeof(buf));
  return buf;
}

int mtuToBytes(ibv_mtu m) { return 128 << static_cast<int>(m); }

namespace {
std::atomic<int> devicesOpen{0};  // VerbsDevice::openCount
}  // namespace

VerbsDevice::VerbsDevice(const VerbsPortChoice& choice, const Config& cfg) : choice_(choice), tc_(cfg.verbs.tc) {
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
  channel_ = ibv_create_comp_channel(ctx_);
  if (channel_) {
    // Non-blocking: the runtime thread reads events until EAGAIN.
    const int cfl = fcntl(channel_->fd, F_GETFL);
    if (cfl < 0 || fcntl(channel_->fd, F_SETFL, cfl | O_NONBLOCK) != 0) {
      ibv_destroy_comp_channel(channel_);
      channel_ = nullptr;  // blocked waits poll instead
    }
  }
  runtime_ = &ProcessRuntime::get();
  runtime_->attach(this);  // its async events
  attached_ = true;
  devicesOpen.fetch_add(1);
  ROCE_INFO("verbs: ", describe(), ", max_msg_sz ", portAttr_.max_msg_sz, ", max_qp_wr ", devAttr_.max_qp_wr);
}

VerbsDevice::~VerbsDevice() {
  if (attached_) {
    runtime_->detach(this);  // the runtime it attached to (a forked child has another)
    devicesOpen.fetch_sub(1);
  }
  if (channel_) ibv_destroy_comp_channel(channel_);  // its CQs went with the groups
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

std::string VerbsDevice::qpError(const ibv_qp* qp) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = objectErrors_.find(qp);
  return it == objectErrors_.end() ? std::string() : it->second;
}

void VerbsDevice::forget(const void* object) {
  std::lock_guard<std::mutex> g(mu_);
  objectErrors_.erase(object);
}

std::string VerbsDevice::cqError(const ibv_cq* cq) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = objectErrors_.find(cq);
  return it == objectErrors_.end() ? std::string() : it->second;
}

void VerbsDevice::addPollFds(std::vector<pollfd>& fds) {
  // Always two entries (polled() finds them by position); -1: not polled.
  fds.push_back({asyncBroken_ ? -1 : ctx_->async_fd, POLLIN, 0});
  fds.push_back({channel_ && !channelBroken_ ? channel_->fd : -1, POLLIN, 0});
}

void VerbsDevice::polled(const pollfd* fds, size_t n) {
  // A descriptor in error (the device was removed) would wake the runtime
  // thread for ever: stop polling it. The groups on the device fail by
  // their own checks (asyncError, their queue pairs' completions).
  auto broken = [&](const pollfd& p, bool& flag, const char* what) {
    if (!(p.revents & (POLLERR | POLLHUP | POLLNVAL)) || flag) return;
    flag = true;
    ROCE_WARN("verbs: the ", what, " of ", choice_.device, " reports an error; no longer polled",
              " (device removed or reset?)");
    std::lock_guard<std::mutex> g(mu_);
    if (asyncError_.empty()) asyncError_ = str("the ", what, " of ", describe(), " failed (device removed or reset?)");
  };
  if (n > 1 && (fds[1].revents & POLLIN)) forwardCqEvents();
  if (n > 0 && (fds[0].revents & POLLIN)) readAsyncEvents();
  if (n > 1) broken(fds[1], channelBroken_, "completion channel");
  if (n > 0) broken(fds[0], asyncBroken_, "asynchronous event descriptor");
}

void VerbsDevice::forwardCqEvents() {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  std::lock_guard<std::mutex> g(cqEventsMu_);
  while (ibv_get_cq_event(channel_, &cq, &ctx) == 0) {  // non-blocking: until EAGAIN
    // Acknowledged at once, under the lock destroyCq takes: a group
    // destroying its CQs waits at most for this loop, never for an ack.
    ibv_ack_cq_events(cq, 1);
    if (ctx) static_cast<CqSet::Notify*>(ctx)->fired();
  }
}

void VerbsDevice::destroyCq(ibv_cq* cq) {
  {
    // ibv_get_cq_event reads the context from the CQ when it takes an event:
    // from here on an event of this CQ finds none instead of a CqSet going
    // away (and, if the destroy fails with EBUSY, instead of a freed one).
    std::lock_guard<std::mutex> g(cqEventsMu_);
    cq->cq_context = nullptr;
  }
  // Outside the lock: the driver may take long (reaper.hpp), and the runtime
  // thread must go on forwarding the other CQs' events meanwhile. An event
  // of this CQ it took before the kernel dropped the unread ones is
  // acknowledged in the same loop, which ibv_destroy_cq waits for.
  const int rc = ibv_destroy_cq(cq);
  if (rc != 0) ROCE_WARN("ibv_destroy_cq on ", describe(), " failed (", rc, "): the CQ stays until the process exits");
  forget(cq);
}

void VerbsDevice::readAsyncEvents() {
  ibv_async_event ev{};
  while (ibv_get_async_event(ctx_, &ev) == 0) {  // non-blocking: until EAGAIN
    const auto type = ev.event_type;
    // A port event matters only for the port this device serves (a multi-port
    // NIC reports the others' flaps too).
    const bool ourPort = type != IBV_EVENT_PORT_ERR || ev.element.port_num == choice_.port;
    const bool qpEvent = type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR || type == IBV_EVENT_QP_ACCESS_ERR;
    const bool fatal = ourPort && (type == IBV_EVENT_DEVICE_FATAL || type == IBV_EVENT_CQ_ERR || qpEvent ||
                                   type == IBV_EVENT_PORT_ERR);
    const void* object = qpEvent ? static_cast<const void*>(ev.element.qp)
                         : type == IBV_EVENT_CQ_ERR ? static_cast<const void*>(ev.element.cq) : nullptr;
    if (fatal) {
      // Recorded before the ack: destroying the QP or CQ waits for the ack,
      // so the object (and its address) is still the one the event named.
      const std::string what =
          str("asynchronous RDMA error on ", describe(), ": ", ibv_event_type_str(type),
              type == IBV_EVENT_PORT_ERR ? " (the port went down: check the link / cable / switch; a reconfigure, "
                                                  "shrink_group or new group goes on the ports still up)" : "");
      std::lock_guard<std::mutex> g(mu_);
      if (object) objectErrors_.emplace(object, what);
      else if (asyncError_.empty()) asyncError_ = what;
    }
    ibv_ack_async_event(&ev);
    ROCE_WARN("verbs async event on ", choice_.device, ": ", ibv_event_type_str(type));
  }
}

int VerbsDevice::openCount() { return devicesOpen.load(); }

std::shared_ptr<VerbsDevice> VerbsDevice::shared(const VerbsPortChoice& choice, const Config& cfg) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<VerbsDevice>> open;
  const std::string key = str(choice.device, ":", choice.port, ":", choice.gidIndex, ":", getpid());
  std::lock_guard<std::mutex> g(mu);
  if (auto dev = open[key].lock(); dev && dev->asyncError().empty()) return dev;
  auto dev = std::make_shared<VerbsDevice>(choice, cfg);
  open[key] = dev;
  return dev;
}

std::shared_ptr<VerbsDevice> VerbsDevice::renewed(const std::shared_ptr<VerbsDevice>& dev, const Config& cfg) {
  // The port's state asked now, not only the events read so far: a rank
  // whose runtime thread has not read the port's PORT_ERR yet must drop it
  // as its peers do.
  ibv_port_attr now{};
  const int port = dev->choice_.port;
  if (ibv_query_port(dev->ctx_, static_cast<uint8_t>(port), &now) != 0 || now.state != IBV_PORT_ACTIVE) return nullptr;
  if (dev->asyncError().empty()) return dev;
  // Back up: opened afresh, its GID chosen again (the table is rebuilt
  // when a port goes down and up).
  VerbsPortChoice again = dev->choice_;
  if (again.ethernet && (again.gidIndex = gidIndexFor(cfg, dev->ctx_, port, now.gid_tbl_len)) < 0) return nullptr;
  try {
    return shared(again, cfg);
  } catch (const Error& e) {
    ROCE_INFO("verbs: ", again.device, " port ", port, " is up again but cannot be opened: ", e.what());
    return nullptr;
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

}  // namespace roce::transport::verbs
