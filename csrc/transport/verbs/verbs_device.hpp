// Choosing and opening the RDMA port the verbs transport uses: the device/port
// filter (ROCE_PG_IB_HCA, NCCL syntax), an active port with Ethernet (RoCE) or
// InfiniBand link layer, and the GID (RoCE v2, IPv4-mapped unless
// ROCE_PG_IB_GID_INDEX says otherwise). Also owns the protection domain, the
// async-event thread and the process-wide checks (memlock, fork safety).
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace roce {

struct Config;

struct VerbsPortChoice {
  std::string device;
  int port = 1;
  int gidIndex = 0;
  bool ethernet = true;  // RoCE (GRH addressing) vs InfiniBand (LID addressing)
};

// The port to use, or nullopt with `why` explaining what was looked for.
std::optional<VerbsPortChoice> chooseVerbsPort(const Config& cfg, std::string& why);

class VerbsDevice {
 public:
  VerbsDevice(const VerbsPortChoice& choice, const Config& cfg);
  ~VerbsDevice();
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
  // First fatal asynchronous event (device/port/QP/CQ error), empty if none.
  std::string asyncError() const;
  // Registers memory, with the memlock fix in the error message on failure.
  ibv_mr* registerMemory(void* addr, size_t len, int access, const char* what);

 private:
  void asyncLoop();

  VerbsPortChoice choice_;
  int tc_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_port_attr portAttr_{};
  ibv_device_attr devAttr_{};
  ibv_gid gid_{};
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::string asyncError_;
  std::thread asyncThread_;
};

std::string gidToString(const ibv_gid& g);
int mtuToBytes(ibv_mtu m);

}  // namespace roce
