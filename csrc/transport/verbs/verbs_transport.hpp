// Point-to-point messages over RDMA verbs (RoCE v2 or InfiniBand), using only
// the portable subset (RC QPs, no SRQ, one SGE, inline <= the returned cap,
// work requests <= max_msg_sz, any non-zero post return is an error).
//
// Protocol, per pair of ranks (receiver-driven rendezvous):
//   sender   --RTS(tag,len)-->      receiver   announces a send (lets
//                                               recv-from-any-source pick a peer)
//   receiver --RTR(tag,len,id)-->   sender     a receive was posted
//   sender: matches RTRs to its sends FIFO per tag, checks the sizes (a
//   mismatch fails both sides: NACK), then streams the message in chunks:
//   copies a chunk into one of its registered staging slots and
//   RDMA_WRITE_WITH_IMMs it into a free landing slot of the receiver
//   (immediate = slot; a 64-byte header in the slot names the receive and the
//   offset). The receiver copies the chunk out and returns the slot with
//   CREDIT(slot). Several chunks are in flight per peer (ROCE_PG_IB_SLOTS) and
//   are spread over ROCE_PG_IB_QPS_PER_CONNECTION queue pairs.
// All memory is registered once, when the transport is created: staging and
// landing slots are the only buffers the NIC touches, so a tensor that is
// freed and reallocated at the same address can never be read through a
// stale registration. Completions are polled by the progress thread; when a
// wait has been idle for ROCE_PG_SPIN_US it blocks on the CQ's completion
// channel instead (prepareWait).
#pragma once
#include <chrono>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../transport.hpp"
#include "verbs_device.hpp"

namespace roce {

class Bootstrap;
struct Config;

class VerbsTransport : public Transport {
 public:
  // Collective over the peers with serve[peer]: exchanges queue-pair endpoints
  // through the store and brings every queue pair to RTS.
  VerbsTransport(int rank, std::shared_ptr<VerbsDevice> dev, const Config& cfg, Bootstrap& bs,
                 const std::vector<bool>& serve, std::chrono::milliseconds timeout);
  ~VerbsTransport() override;
  const char* name() const override { return "verbs"; }
  void postSend(Request* r) override;
  void postRecv(Request* r) override;
  bool progress() override;
  bool hasUnmatched(int peer, uint64_t tag) override;
  std::string checkPeers() override;
  void failAll(const std::string& why) override;
  bool prepareWait(std::vector<pollfd>& fds, bool anySource) override;
  void afterWait() override;

  struct Ctrl;
  struct Qp;
  struct Peer;

 private:
  void setUpPeer(int peer);
  void connectPeer(int peer, const std::string& remote);
  void postRecvBuffer(int peer, int qp, int index);
  void queueCtrl(int peer, const Ctrl& msg);
  bool flushCtrl(int peer);
  bool streamSends(int peer);
  void onCompletion(const struct ibv_wc& wc);
  void onCtrl(int peer, const Ctrl& msg);
  void onData(int peer, uint32_t slot, uint32_t byteLen);
  int ctrlRecvs() const;
  void matchSend(int peer, Request* r, uint32_t reqId, uint64_t len);
  void retire(Qp& q);
  void killPeer(int peer, const std::string& why);
  std::string failureText(int peer, const struct ibv_wc& wc) const;
  size_t chunkFor(const Peer& p) const;

  int rank_;
  std::shared_ptr<VerbsDevice> dev_;
  int qpsPerPeer_, slots_, sqDepth_, rqDepth_;
  size_t slotBytes_;   // payload bytes per slot (this side)
  size_t stride_;      // header + payload, 64-byte aligned
  int tc_, sl_, timeout_, retryCnt_;
  struct CqDeleter { void operator()(struct ibv_cq* cq) const; };
  struct ChannelDeleter { void operator()(struct ibv_comp_channel* ch) const; };
  // The CQ's completion channel: idle waits block on its descriptor instead of
  // busy-polling (null if the device offers none: then they keep polling).
  std::unique_ptr<struct ibv_comp_channel, ChannelDeleter> channel_;  // outlives cq_
  bool armed_ = false;  // a notification was requested and no event consumed since
  std::unique_ptr<struct ibv_cq, CqDeleter> cq_;  // declared before peers_: destroyed after their queue pairs
  std::vector<std::unique_ptr<Peer>> peers_;  // null for peers not served
};

}  // namespace roce
