// One opened RDMA port (chosen by port_choice.hpp): its context, the
// protection domain, the async events (read on the process's runtime thread) and the process-wide
// checks (memlock, fork safety). One VerbsDevice per port per process
// (VerbsDevice::shared): every group of the process uses the same
// context and protection domain, so a job with 20 groups opens the NIC once.
// An asynchronous error that names a queue pair or CQ is kept for that object
// only: one group's broken queue pair fails that group's peer, not the
// groups beside it; a device or port error fails every group on the port.
// One completion channel per port per process, too (a channel per group
// would cost a descriptor per group and rail): every group's CQs raise their
// events on it, the runtime thread reads them and wakes the group whose CQ
// it was (CqSet::notified). A woken group then polls its CQs on its own
// thread; only the blocked wait's wake-up takes the extra hop.
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <map>
#include <memory>

#include "../../runtime/process_runtime.hpp"
#include "port_choice.hpp"

namespace roce {
struct Config;
}
namespace roce::transport::verbs {
using namespace roce::runtime;


class VerbsDevice : public RuntimeService {
 public:
  // The process's device for `choice` (opened on first use, closed when the
  // last group using it goes).
  // A device that reported an error (its port went down, it was reset) is
  // not handed out again: the groups that used it fail by it, and a later
  // group (a reconfigure, a new group) gets the port opened afresh, its GID
  // and MTU read anew.
  static std::shared_ptr<VerbsDevice> shared(const VerbsPortChoice& choice, const Config& cfg);
  // For a group derived from one that drives `dev` (a subgroup, a shrink):
  // null while the port is not ACTIVE (the derived group goes on the
  // others); `dev` if it has no error; else the port opened afresh.
  static std::shared_ptr<VerbsDevice> renewed(const std::shared_ptr<VerbsDevice>& dev, const Config& cfg);
  // How many VerbsDevices the process holds open (tests).
  static int openCount();

  VerbsDevice(const VerbsPortChoice& choice, const Config& cfg);
  ~VerbsDevice() override;
  VerbsDevice(const VerbsDevice&) = delete;
  VerbsDevice& operator=(const VerbsDevice&) = delete;

  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  const ibv_port_attr& portAttr() const { return portAttr_; }
  const ibv_device_attr& deviceAttr() const { return devAttr_; }
  const VerbsPortChoice& choice() const { return choice_; }
  const ibv_gid& gid() const { return gid_; }
  uint32_t maxMsgSize() const { return portAttr_.max_msg_sz; }
  // "rxe0 port 1, GID index 1 (::ffff:10.99.0.1), MTU 1024, TC 0" for messages.
  std::string describe() const;
  // First fatal asynchronous event of the device or the port, empty if none.
  std::string asyncError() const;
  // First fatal asynchronous event naming this queue pair / CQ, empty if none.
  std::string qpError(const ibv_qp* qp) const;
  std::string cqError(const ibv_cq* cq) const;
  // Before a QP or CQ is destroyed: its error, if any, must not be pinned on
  // a later object at the same address (the device outlives the groups).
  void forget(const void* object);
  // The process's completion channel on this port (null if the provider has
  // none: blocked waits then poll). CQs created on it pass their CqSet as
  // cq_context.
  ibv_comp_channel* completionChannel() const { return channel_; }
  // Destroys a CQ of the channel: first clears its context under the lock
  // the runtime thread holds while it takes, acknowledges and forwards
  // events, so no notification reaches its CqSet afterwards (the kernel
  // drops the events not yet read); then destroys it outside that lock
  // (ibv_destroy_cq waits only for the acknowledgement of an event already
  // taken, which comes in the same locked loop).
  void destroyCq(ibv_cq* cq);
  // Runs `f` under that same lock: no CQ event is being forwarded meanwhile
  // (a CqSet handed to the reaper drops its group's wake-up this way).
  template <typename F>
  void withCqEventsHeld(F&& f) {
    std::lock_guard<std::mutex> g(cqEventsMu_);
    f();
  }
  // Registers memory, with the memlock fix in the error message on failure.
  ibv_mr* registerMemory(void* addr, size_t len, int access, const char* what);

 private:
  Clock::time_point tick(Clock::time_point now) override { return now + std::chrono::seconds(1); }
  void addPollFds(std::vector<pollfd>& fds) override;
  void polled(const pollfd* fds, size_t n) override;
  void readAsyncEvents();
  void forwardCqEvents();

  VerbsPortChoice choice_;
  int tc_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  std::mutex cqEventsMu_;  // taking and acknowledging events vs destroying CQs (destroyCq)
  bool asyncBroken_ = false, channelBroken_ = false;  // in error: no longer polled (runtime thread only)
  ibv_port_attr portAttr_{};
  ibv_device_attr devAttr_{};
  ibv_gid gid_{};
  mutable std::mutex mu_;
  std::string asyncError_;
  std::map<const void*, std::string> objectErrors_;  // by ibv_qp* / ibv_cq*
  bool attached_ = false;
  ProcessRuntime* runtime_ = nullptr;
};

std::string gidToString(const ibv_gid& g);
int mtuToBytes(ibv_mtu m);

}  // namespace roce::transport::verbs
