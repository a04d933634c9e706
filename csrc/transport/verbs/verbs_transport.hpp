// VerbsTransport: one group's point-to-point messages over RDMA verbs (RoCE
// v2 or InfiniBand), portable subset only, for the peers the group's network
// transport serves. Receiver-driven rendezvous with eager small messages;
// copied or zero-copy chunks into landing slots the receiver grants, spread
// over queue pairs on every rail; landing and staging pools shared by the
// process's groups. The design (protocol, rails, eager, device memory,
// memory and grants, connections, failure order): docs/ARCHITECTURE.md,
// "The verbs transport".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../transport.hpp"
#include "cq_set.hpp"
#include "dmabuf.hpp"
#include "landing_pool.hpp"
#include "reg_cache.hpp"
#include "slot_pool.hpp"
#include "staging_pool.hpp"
#include "verbs_device.hpp"
#include "verbs_pair.hpp"

namespace roce {
struct Config;
}
namespace roce::transport::verbs {

struct Endpoint;

// The pools of a group whose rank reaches `routedPeers` peers over verbs
// (verbs_connect.cpp says why these sizes): bytes, whole slots of `stride`
// (landing: the open share it asks of the process's landing pool, beside
// the `reserved` slots kept for it there: landing_pool.hpp).
struct VerbsPoolSizes {
  size_t landing, staging;
  uint32_t reserved;
};
VerbsPoolSizes verbsPoolSizes(const Config& cfg, size_t stride, int routedPeers);
// Bytes the verbs transport registers per rank with `cfg` once connected to
// `peers` peers (landing pool + staging pool + each peer's control rings) in
// a group that routes `routedPeers` peers over verbs (-1: `peers`), assuming
// the device grants the queue depths asked for. The formula the README
// states, the doctor's memlock check uses, and tests/scale projects. With
// `rails` ports, every pool and ring is registered once per port.
size_t verbsRegisteredBytes(const Config& cfg, int peers, int rails = 1, int routedPeers = -1);
// Of those, the staging pool's: registered once per process, by the group
// that reaches the most peers over verbs (staging_pool.hpp).
size_t verbsStagingBytes(const Config& cfg, int rails, int routedPeers);
// And the landing pool's, as the first group of the process registers it
// (its reservation and open share, landing_pool.hpp). A further group of
// the same shape adds verbsReservedBytes. The groups' counters count
// neither pool: only their connections' control rings.
size_t verbsLandingBytes(const Config& cfg, int rails, int routedPeers);
size_t verbsReservedBytes(const Config& cfg, int rails, int routedPeers);
// Queue pairs per connection in a group whose ranks drive at most `maxRails`
// ports: ROCE_PG_IB_QPS_PER_CONNECTION, at least one per channel and per rail.
int groupQueuePairs(const Config& cfg, int maxRails);

class VerbsTransport : public Transport {
 public:
  // Serves peers whose connections arrive through adoptConnection, over
  // `rails` (one or more ports), with `qpsPerPeer` queue pairs per connection
  // (the same on every rank of the group: groupQueuePairs). `routedPeers`:
  // the group's peers this transport serves (they size the pools).
  VerbsTransport(int rank, int size, Rails rails, const Config& cfg, int qpsPerPeer, int routedPeers);
  ~VerbsTransport() override;
  const char* name() const override { return "verbs"; }
  void postSend(Request* r) override;
  void postRecv(Request* r) override;
  bool progress() override;
  bool hasUnmatched(int peer, uint64_t tag) override;
  std::string checkPeers() override;
  void failAll(const std::string& why) override;
  void failPeer(int peer, const std::string& why) override;
  bool prepareWait(std::vector<pollfd>& fds, bool anySource) override;
  bool needsConnection(int peer) const override;
  bool registersDmabuf(std::string* why) const override {
    *why = dmabuf_.why;
    return dmabuf_.supported;
  }
  void adoptConnection(int peer, int fd) override;
  std::unique_ptr<ExposedMemory> expose(void* base, size_t len, std::string* why) override;
  void postOneSided(Request* r) override;

 private:
  using Pair = verbs::Pair;
  using Qp = verbs::Qp;
  using ActiveSend = verbs::ActiveSend;
  using Ctrl = verbs::Ctrl;

  // ---- connections (verbs_connect.cpp) ----
  Pair& peerOf(int p);  // the peer's state, created (unconnected) on first use
  void ensurePools();
  // A broken group's queue pairs, registrations and CQs to the reaper (reaper.hpp).
  void handOverToReaper();
  // ---- posting and matching (verbs_transport.cpp) ----
  bool flushAnnouncements(int peer);
  bool streamSends(int peer);
  // False (nothing posted) when the chunk needs a staging slot and none is free.
  bool postChunk(int peer, Qp& q, ActiveSend& as, const verbs::SlotHeader& h, const char* payload);
  void giveStaging(uint32_t id);
  void announce(int peer, uint64_t tag, verbs::Arrival a, const char* eagerData = nullptr);
  void deliverEager(int peer, uint32_t id, const char* data, uint64_t len);
  size_t eagerLimit() const { return std::min(eagerMax_, slotBytes_); }
  void matchSend(int peer, Request* r, const Ctrl& rtr);
  void matchEager(int peer, ActiveSend& as, const Ctrl& rtr);
  void toRendezvous(int peer, ActiveSend& as);
  void finishSend(int peer, ActiveSend& as);
  RegCache::Entry* registerUserBuffer(const Request& r);
  std::string deviceRegFailure(const Request& r, const char* why) const;
  uint64_t zeroCopyPiece(uint64_t len, int qps) const;
  // ---- one-sided writes and reads (verbs_one_sided.cpp) ----
  bool streamOneSided(int peer);
  // False (nothing posted) when the piece needs a staging slot and none is free.
  bool postOneSidedPiece(int peer, Qp& q, verbs::ActiveOneSided& op);
  // A piece completed; `staged`: the staging slot it went through (a read's bytes are there).
  void oneSidedPieceDone(int peer, uint32_t id, const StagingPool::Slot* staged, uint64_t pieceOffset);
  // ---- landing slots granted to peers (verbs_grants.cpp) ----
  int need(const Pair& peer) const;
  uint32_t standingReserve() const;  // open slots kept free of standing grants
  // Takes a landing slot for `peer` and records it as the peer's: its
  // reserved one, or an open one (standing: only while more than the
  // reserve is free); false if there is none.
  enum class Grant { Reserved, Standing, Demand };
  bool takeLanding(int peer, Pair& state, Grant kind, LandingPool::Slot* slot);
  bool grantTo(int peer, Pair& state);  // a slot for a receive's need, then CREDIT
  void sendCredit(int peer, const LandingPool::Slot& slot);
  void giveLanding(uint32_t slot);  // back to the process's pool
  void grantNeeded(int peer);
  void landingConsumed(int peer, uint32_t slot);
  bool serveNeedy();  // grants what it can to the peers waiting for slots; true if any
  // ---- completions (verbs_completions.cpp) ----
  bool pollCompletions();
  bool pollRail(size_t rail, struct ibv_wc* wcs);
  void onCompletion(const struct ibv_wc& wc);
  void onCtrl(int peer, const Ctrl& msg);
  void onData(int peer, uint32_t slot, uint32_t byteLen);
  // peerEnded: the peer ended its side on purpose (Request::peerEnded).
  void killPeer(int peer, const std::string& why, bool peerEnded = false);
  void dropSideChannel(int peer, Pair& state);

  VerbsDevice& railOf(const Qp& q) const { return *rails_[q.rail]; }

  int rank_;
  Rails rails_;
  int qpsPerPeer_, cap_, sqDepth_, rqDepth_;
  size_t slotBytes_;   // payload bytes per landing/staging slot
  size_t stride_;      // header + payload, 64-byte aligned
  VerbsPoolSizes pools_;  // registered at the first connection (verbsPoolSizes)
  int tc_, sl_, timeout_, retryCnt_;
  size_t maxMsg_;           // port max_msg_sz: no work request is larger
  size_t zeroCopyMin_;      // ROCE_PG_IB_ZERO_COPY_MIN_BYTES (0: off)
  size_t eagerMax_;         // ROCE_PG_IB_EAGER_MAX_BYTES (0: off)
  bool slowTeardown_ = false;  // ROCE_PG_TEST_FAULT=slow_teardown (reaper.hpp)
  // Declared before peers_: destroyed after their queue pairs, so no MR or CQ
  // goes while a queue pair could still use it.
  std::unique_ptr<RegCache> regCache_;
  std::unique_ptr<RegCache> deviceRegCache_;  // device memory: ROCE_PG_IB_DEVICE_REG_BYTES
  DmabufAnswer dmabuf_;  // the provider's answer, asked once at construction
  std::vector<std::unique_ptr<CqSet>> cqs_;  // per rail (a CQ belongs to one device); empty until the first connection
  std::shared_ptr<LandingPool> landing_;  // the process's: peers are granted slots of it (landing_pool.hpp)
  LandingPool::Share landingShare_;       // this group's reservation there
  std::shared_ptr<StagingPool> staging_;  // the process's (staging_pool.hpp)
  struct Landing {
    int peer;       // granted to
    bool reserved;  // one of the group's reserved slots
  };
  std::unordered_map<uint32_t, Landing> landingOwner_;  // slots granted to peers and not consumed, by id
  struct StagingUse {
    int peer = -1;
    ActiveSend* send = nullptr;
    uint32_t oneSidedId = 0;  // a one-sided write's or read's piece (send null)
    uint64_t pieceOffset = 0;
    char* data = nullptr;     // the slot's bytes (a read's piece lands there)
  };
  std::unordered_map<uint32_t, StagingUse> stagingOwner_;  // this group's staging slots in flight, by id
  verbs::PairShape shape_;  // what every pair shares (filled by the constructor)
  // Declared after what the pairs use (pools, CQs, caches): destroyed first.
  std::vector<std::unique_ptr<Pair>> peers_;  // null for peers never talked to
  std::vector<int> live_;                     // peers with state, for iteration
  std::vector<int> needy_;                    // peers waiting for landing grants
  uint64_t needyTried_ = 0;                   // LandingPool::wakeups() when progress() last served them
};

}  // namespace roce::transport::verbs
