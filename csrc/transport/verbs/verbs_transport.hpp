// Point-to-point messages over RDMA verbs (RoCE v2 or InfiniBand), using only
// the portable subset (RC QPs, no SRQ, one SGE, inline <= the returned cap,
// work requests <= max_msg_sz, any non-zero post return is an error).
//
// Protocol, per pair of ranks (receiver-driven rendezvous; small messages eager):
//   sender   --RTS(tag,len)-->      receiver   announces a send (lets
//                                               recv-from-any-source pick a peer)
//   receiver --RTR(tag,len,id[,addr,rkey,piece])--> sender   a receive was posted
//   sender: matches RTRs to its sends FIFO per tag, checks the sizes (a
//   mismatch fails both sides: NACK), then streams the message in chunks.
//   Each chunk takes a landing-slot credit of the receiver and ends with an
//   RDMA_WRITE_WITH_IMM of a 64-byte header into that slot (immediate = slot;
//   the header names the receive, the offset, the length and the mode). The
//   receiver handles the chunk and returns the slot with CREDIT(slot).
//   Two modes, chosen per message:
//    * copy: the sender copies the chunk into one of its registered staging
//      slots and writes header + payload into the landing slot; the receiver
//      copies the payload out. Small messages, and buffers the registration
//      cache cannot take (no owner, over ROCE_PG_IB_REG_CACHE_BYTES).
//    * zero copy (>= ROCE_PG_IB_ZERO_COPY_MIN_BYTES, both buffers registered
//      through RegCache): the RTR carries address + rkey of the receive
//      buffer, the sender RDMA_WRITEs each piece from its tensor straight into
//      the receiver's tensor, then (same queue pair, so ordered after it) the
//      header alone with WRITE_WITH_IMM. No byte is copied by a CPU.
//   Several chunks are in flight per peer (ROCE_PG_IB_SLOTS) and are spread
//   over ROCE_PG_IB_QPS_PER_CONNECTION queue pairs.
//   Eager (messages of at most ROCE_PG_IB_EAGER_MAX_BYTES and one chunk): no
//   RTS, no waiting for the RTR; the sender writes header (tag, length) and
//   payload into a landing slot at once, so the data arrives after one trip
//   instead of three. The receiver pairs each message it is told of (an RTS,
//   or eager data) with its receives per tag in order, buffering eager data
//   that finds no receive yet. RTS and eager data therefore go in posting
//   order on QP 0 (the announcement queue); other control messages may pass
//   them. Every receive still sends its RTR: the sender consumes RTRs strictly
//   in order per tag, and an eager send completes only once its write is done
//   and its RTR arrived, failing on a size mismatch as a rendezvous send does.
//   Inline sends (IBV_SEND_INLINE) carry control messages and chunks of up to
//   the granted inline size (asked: 256 bytes) without a DMA read.
// Memory: staging and landing slots and control buffers are registered once.
// User buffers are registered through RegCache, whose entries keep their
// allocation alive (see reg_cache.hpp): a tensor freed and reallocated at the
// same address is a different allocation, never a stale registration. A
// receive that fails (peer death, abort, deadline) moves the peer's queue
// pairs to the error state first, so no write lands after it; a NACKed
// receive was never written to. Completions are polled by the progress thread;
// when a wait has been idle for ROCE_PG_SPIN_US it blocks on the CQ's
// completion channel instead (prepareWait).
#pragma once
#include <chrono>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../transport.hpp"
#include "reg_cache.hpp"
#include "verbs_device.hpp"

namespace roce {

class Bootstrap;
struct Config;

class VerbsTransport : public Transport {
 public:
  // Collective over the peers with serve[peer]: exchanges queue-pair endpoints
  // through the store and brings every queue pair to RTS.
  VerbsTransport(int rank, std::shared_ptr<VerbsDevice> dev, const Config& cfg, Bootstrap& bs,
                 const std::vector<bool>& serve, std::chrono::steady_clock::time_point deadline,
                 std::chrono::milliseconds timeout);
  ~VerbsTransport() override;
  const char* name() const override { return "verbs"; }
  void postSend(Request* r) override;
  void postRecv(Request* r) override;
  bool progress() override;
  bool hasUnmatched(int peer, uint64_t tag) override;
  std::string checkPeers() override;
  void failAll(const std::string& why) override;
  void failPeer(int peer, const std::string& why) override { killPeer(peer, why); }
  bool prepareWait(std::vector<pollfd>& fds, bool anySource) override;
  void afterWait() override;

  struct Ctrl;
  struct Qp;
  struct Peer;
  struct Arrival;

 private:
  void setUpPeer(int peer);
  void connectPeer(int peer, const std::string& remote);
  void postRecvBuffer(int peer, int qp, int index);
  void queueCtrl(int peer, const Ctrl& msg);
  bool flushCtrl(int peer);
  void postCtrl(int peer, Ctrl msg);
  bool flushAnnouncements(int peer);
  bool streamSends(int peer);
  void postChunk(int peer, Qp& q, struct ActiveSend& as, const struct SlotHeader& h, const char* payload);
  void announce(int peer, uint64_t tag, Arrival a, const char* eagerData = nullptr);
  void deliverEager(int peer, uint32_t id, const char* data, uint64_t len);
  size_t eagerLimit(const Peer& p) const;
  void onCompletion(const struct ibv_wc& wc);
  void onCtrl(int peer, const Ctrl& msg);
  void onData(int peer, uint32_t slot, uint32_t byteLen);
  int ctrlRecvs() const;
  void matchSend(int peer, Request* r, const Ctrl& rtr);
  void matchEager(int peer, struct ActiveSend& as, const Ctrl& rtr);
  void finishSend(int peer, struct ActiveSend& as);
  RegCache::Entry* registerUserBuffer(const Request& r);
  uint64_t zeroCopyPiece(uint64_t len, int qps) const;
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
  size_t maxMsg_;           // port max_msg_sz: no work request is larger
  size_t zeroCopyMin_;      // ROCE_PG_IB_ZERO_COPY_MIN_BYTES (0: off)
  size_t eagerMax_;         // ROCE_PG_IB_EAGER_MAX_BYTES (0: off)
  struct CqDeleter { void operator()(struct ibv_cq* cq) const; };
  struct ChannelDeleter { void operator()(struct ibv_comp_channel* ch) const; };
  // The CQ's completion channel: idle waits block on its descriptor instead of
  // busy-polling (null if the device offers none: then they keep polling).
  std::unique_ptr<struct ibv_comp_channel, ChannelDeleter> channel_;  // outlives cq_
  bool armed_ = false;  // a notification was requested and no event consumed since
  // Declared before peers_: destroyed after their queue pairs, so no MR goes
  // while a queue pair could still use it.
  std::unique_ptr<RegCache> regCache_;
  std::unique_ptr<struct ibv_cq, CqDeleter> cq_;  // declared before peers_: destroyed after their queue pairs
  std::vector<std::unique_ptr<Peer>> peers_;  // null for peers not served
};

}  // namespace roce
