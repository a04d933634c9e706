// Setting up a peer's queue pairs when its connection arrives, and the
// endpoint exchange over the TCP side channel (docs/ARCHITECTURE.md, "The
// verbs transport").
#include <arpa/inet.h>
#include <cstdint>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "../../common/config.hpp"
#include "../../common/error.hpp"
#include "../../common/log.hpp"
#include "../../common/page_memory.hpp"
#include "../../common/sockets.hpp"
#include "reaper.hpp"
#include "verbs_endpoint.hpp"
#include "verbs_transport.hpp"

namespace roce::transport::verbs {


namespace {
// Send WRs per queue pair: control messages (bounded by the peer's credits)
// and up to two per data chunk in flight (zero copy: payload + header).
constexpr int kSqDepth = 128;
}  // namespace

namespace {
int sendDepth(int cap, int maxWr) { return std::min(std::max(kSqDepth, 2 * cap + 64), maxWr); }
int recvDepth(int cap, int maxWr) { return std::min(cap + kCtrlRecvs + 4, maxWr); }
}  // namespace

int groupQueuePairs(const Config& cfg, int maxRails) {
  return std::max({cfg.verbs.qpsPerConnection, cfg.algo.nChannels, maxRails});
}

namespace {
size_t strideOf(size_t slotBytes) { return (sizeof(SlotHeader) + slotBytes + 63) & ~size_t(63); }
}  // namespace

VerbsPoolSizes verbsPoolSizes(const Config& cfg, size_t stride, int routedPeers) {
  // A peer holds at most ROCE_PG_IB_SLOTS landing slots at once (its
  // credits, the standing two among them), so slots beyond the group's
  // peers' sum could never be granted. Twice that, plus twice the cap, keeps
  // the grant rules' reserve (max(cap, pool/4) free for standing grants)
  // satisfied while every peer holds its full cap, so a small group grants
  // as with the full pool (with ROCE_PG_IB_SLOTS of 2 or 3 a peer that
  // connects after its demand grants can hold cap + 2, and standing grants
  // may then wait: eager sends go as rendezvous meanwhile).
  // ROCE_PG_IB_POOL_BYTES stays the ceiling (reached from 15 peers with the
  // defaults, so the world group of a large job registers the full pool); a
  // subgroup of a few machines registers a few MiB.
  const uint64_t peers = static_cast<uint64_t>(std::max(routedPeers, 0));
  const uint64_t cap = static_cast<uint64_t>(cfg.verbs.slots);
  const uint64_t landingSlots = std::min<uint64_t>(cfg.verbs.poolBytes / stride, 2 * cap * (peers + 1));
  // Copied chunks in flight, across peers: at most each peer's credits.
  const uint64_t stagingSlots =
      std::min<uint64_t>(std::max(cfg.verbs.poolBytes / 4, 2 * stride) / stride, std::max<uint64_t>(2, peers * cap));
  // Of the landing slots, one per peer is reserved for the group in the
  // process's pool (landing_pool.hpp: no group waits for another's); the
  // rest is the open share it asks for.
  // So the first group registers what it would alone, and a further group
  // of the same shape adds its reservation.
  const auto reserved = static_cast<uint32_t>(
      std::clamp<uint64_t>(peers, 1, LandingPool::kMaxReservedPerGroup));
  const uint64_t open = std::max<uint64_t>(2, landingSlots > reserved ? landingSlots - reserved : 0);
  return {open * stride, stagingSlots * stride, reserved};
}

size_t verbsRegisteredBytes(const Config& cfg, int peers, int rails, int routedPeers) {
  const int qps = groupQueuePairs(cfg, rails);
  const size_t perPeer = static_cast<size_t>(qps) *
                         (recvDepth(cfg.verbs.slots, 1 << 30) + sendDepth(cfg.verbs.slots, 1 << 30)) * kCtrlBytes;
  const int routed = routedPeers < 0 ? peers : routedPeers;
  return static_cast<size_t>(rails) * static_cast<size_t>(peers) * perPeer + verbsLandingBytes(cfg, rails, routed) +
         verbsStagingBytes(cfg, rails, routed);
}

size_t verbsLandingBytes(const Config& cfg, int rails, int routedPeers) {
  const size_t stride = strideOf(cfg.verbs.slotBytes);
  const VerbsPoolSizes pools = verbsPoolSizes(cfg, stride, routedPeers);
  return static_cast<size_t>(rails) * pageRound(pools.landing + pools.reserved * stride);
}

size_t verbsReservedBytes(const Config& cfg, int rails, int routedPeers) {
  const size_t stride = strideOf(cfg.verbs.slotBytes);
  // A region holds at least two slots (SlotPool).
  const uint32_t slots = std::max<uint32_t>(2, verbsPoolSizes(cfg, stride, routedPeers).reserved);
  return static_cast<size_t>(rails) * pageRound(slots * stride);
}

size_t verbsStagingBytes(const Config& cfg, int rails, int routedPeers) {
  return static_cast<size_t>(rails) * pageRound(verbsPoolSizes(cfg, strideOf(cfg.verbs.slotBytes), routedPeers).staging);
}

VerbsTransport::VerbsTransport(int rank, int size, Rails rails, const Config& cfg, int qpsPerPeer,
                               int routedPeers)
    : rank_(rank), rails_(std::move(rails)) {
  if (rails_.empty() || rails_.size() > static_cast<size_t>(kMaxRails))
    throwInvalid(str("the verbs transport drives 1 to ", kMaxRails, " ports, not ", rails_.size()));
  qpsPerPeer_ = qpsPerPeer;
  cap_ = cfg.verbs.slots;
  // The most every rail allows: one queue depth and message size for all queue pairs.
  int maxWr = INT32_MAX;
  maxMsg_ = SIZE_MAX;
  for (const auto& dev : rails_) {
    maxWr = std::min(maxWr, dev->deviceAttr().max_qp_wr);
    maxMsg_ = std::min<size_t>(maxMsg_, dev->maxMsgSize());
  }
  // Send: room for every chunk of the peer's cap in zero copy (two WRs each)
  // beside the control messages. Receive: every queue pair may receive all of
  // a peer's chunks in flight; queue pair 0 also takes the control messages.
  sqDepth_ = sendDepth(cap_, maxWr);
  rqDepth_ = recvDepth(cap_, maxWr);
  if (rqDepth_ - cap_ - 4 < kCtrlReserve + 4 || sqDepth_ < 2 * cap_ + 8)
    throwInvalid(str(describeRails(rails_), " allows only ", maxWr, " work requests per queue; with ROCE_PG_IB_SLOTS=", cap_,
                     " too few are left for control messages: lower ROCE_PG_IB_SLOTS"));
  zeroCopyMin_ = cfg.verbs.zeroCopyMinBytes;
  eagerMax_ = cfg.verbs.eagerMaxBytes;
  slowTeardown_ = testFault() == "slow_teardown";
  regCache_ = std::make_unique<RegCache>(rails_, defaultRegCacheBytes(cfg.verbs.regCacheBytes), rank_);
  deviceRegCache_ = std::make_unique<RegCache>(rails_, cfg.verbs.deviceRegBytes, rank_, /*overcommit=*/true);
  // Asked before any call could hand over a dma-buf (a failed registration
  // costs microseconds): GPUDirect's choice needs the answer at issue time.
  // (The first rail's answer: the rails of one rank are normally NICs of one kind.)
  if (cfg.device.gpudirect != GpudirectMode::Off) dmabuf_ = probeDmabuf(rails_[0]->pd(), rails_[0]->describe());
  else dmabuf_.why = "ROCE_PG_GPUDIRECT=off";
  slotBytes_ = std::min<size_t>(cfg.verbs.slotBytes, maxMsg_ - sizeof(SlotHeader));
  stride_ = strideOf(slotBytes_);
  pools_ = verbsPoolSizes(cfg, stride_, routedPeers);
  tc_ = cfg.verbs.tc;
  sl_ = cfg.verbs.sl;
  timeout_ = cfg.verbs.timeout;
  retryCnt_ = cfg.verbs.retryCnt;
  shape_ = {rank_, qpsPerPeer_, sqDepth_, rqDepth_, cap_, slotBytes_, stride_, tc_, sl_, timeout_, retryCnt_};
  peers_.resize(size);
}

VerbsTransport::~VerbsTransport() {
  // A broken group (a peer failed: its queue pairs are in the error state,
  // see killPeer) leaves its kernel objects to the reaper, because the
  // driver may take long to destroy them (reaper.hpp); the NIC no longer
  // touches their buffers once every queue pair is in the error state.
  // Otherwise: queue pairs before the CQs, pools and registrations they use.
  const bool broken = std::any_of(live_.begin(), live_.end(), [&](int p) { return !peers_[p]->deadReason.empty(); });
  if (broken) {
    for (int p : live_) {
      Pair& peer = *peers_[p];
      peer.toError();
      // Its EOF tells a peer without a lifeline watch that this rank left: now, not after the reaper.
      if (peer.sock >= 0) close(peer.sock);
      peer.sock = -1;
    }
  } else {
    for (int p : live_) peers_[p]->release();
    peers_.clear();
  }
  // No queue pair reads them any more: this group's staging slots in flight
  // go back to the process's pool, and no give() may wake this group now.
  if (staging_) {
    staging_->forget(wakeup());
    for (const auto& [id, use] : stagingOwner_) staging_->give(id);
  }
  // Likewise the landing slots granted to peers, then the reservation.
  if (landing_) {
    landing_->forget(wakeup());
    for (const auto& [id, l] : landingOwner_) landing_->give(l.reserved ? &landingShare_ : nullptr, id);
    landingOwner_.clear();
    landing_->leave(landingShare_);
  }
  if (!broken) return;
  try {
    handOverToReaper();
  } catch (const std::exception& e) {  // out of memory: what was not handed over is destroyed here, in order
    ROCE_WARN("rank ", rank_, ": the broken group's verbs objects are destroyed on this thread (", e.what(), ")");
  }
}

void VerbsTransport::handOverToReaper() {
  auto remains = std::make_unique<VerbsRemains>();
  for (int p : live_) {
    peers_[p]->forgetCounters();  // the group's counters go with it
    remains->pairs.push_back(std::move(peers_[p]));
  }
  peers_.clear();
  for (auto* cache : {&regCache_, &deviceRegCache_}) {
    if (!*cache) continue;
    if (Counters* c = counters()) c->cachedMrs.fetch_sub((*cache)->entries(), std::memory_order_relaxed);
    (*cache)->setCounters(nullptr);  // likewise
    remains->regCaches.push_back(std::move(*cache));
  }
  for (auto& cqs : cqs_) cqs->detachWake();  // the group's wake-up goes with it
  remains->cqs = std::move(cqs_);
  remains->landing = std::move(landing_);
  remains->staging = std::move(staging_);
  remains->rails = rails_;
  releaseLater(std::move(remains), std::chrono::milliseconds(slowTeardown_ ? 15000 : 0));
}

Pair& VerbsTransport::peerOf(int p) {
  auto& slot = peers_.at(p);
  if (!slot) {
    slot = std::make_unique<Pair>(p, shape_, rails_, counters());
    live_.push_back(p);
  }
  return *slot;
}

bool VerbsTransport::needsConnection(int p) const {
  const auto& peer = peers_.at(p);
  return !peer || (peer->phase == Pair::Phase::Unconnected && peer->deadReason.empty());
}

void VerbsTransport::ensurePools() {
  if (landing_) return;
  // Registered at the first connection, not at init: a group (or subgroup)
  // that never talks over the network pins nothing.
  // All or nothing: a registration that fails (memlock) leaves no half set
  // behind for the next connection to add to.
  std::vector<std::unique_ptr<CqSet>> cqs;
  for (const auto& dev : rails_) cqs.push_back(std::make_unique<CqSet>(*dev, wakeup()));
  // The process's landing pool: this group joins it with its reserved slots
  // (one per peer) and the open share its peers may hold at once.
  auto landing = LandingPool::shared(rails_, stride_);
  // Copied chunks in flight across all peers (each peer's credits); at most
  // a quarter of ROCE_PG_IB_POOL_BYTES (most large messages go zero copy and
  // need no staging). The process's pool: it grows only if this group asks
  // more than every group before it.
  auto staging = StagingPool::shared(rails_, stride_);
  staging->reserve(static_cast<uint32_t>(pools_.staging / stride_));
  // Last: the one step that leaves something behind (the reservation) can
  // no longer be followed by a failure.
  landing->join(landingShare_, pools_.reserved, static_cast<uint32_t>(pools_.landing / stride_));
  cqs_ = std::move(cqs);
  landing_ = std::move(landing);
  staging_ = std::move(staging);
}

void VerbsTransport::adoptConnection(int p, int fd) {
  Pair& peer = peerOf(p);
  if (!peer.deadReason.empty() || peer.phase != Pair::Phase::Unconnected || peer.sock >= 0) {
    close(fd);
    return;
  }
  peer.sock = fd;  // owned by the pair from here on (closed by release())
  setNonBlocking(fd, true);
  try {
    ensurePools();
    peer.setUp(cqs_);
    Endpoint me;
    for (size_t r = 0; r < rails_.size(); ++r) {
      const VerbsDevice& dev = *rails_[r];
      me.rails.push_back({dev.portAttr().lid, dev.gid(), static_cast<int>(dev.portAttr().active_mtu)});
    }
    for (auto& q : peer.qps) me.qps.push_back({q.qp->qp_num, static_cast<uint32_t>(q.rail)});
    peer.localPsn = std::mt19937(std::random_device{}())() & 0xffffff;
    me.psn = peer.localPsn;
    me.slotBytes = slotBytes_;
    me.stride = stride_;
    me.ctrlRecvs = static_cast<uint32_t>(rqDepth_ - cap_ - 4);
    // Standing grants: the peer's reserved slot (then always its own), and
    // an open one while the pool keeps its reserve.
    LandingPool::Slot slot;
    for (int i = 0; i < kStandingGrants; ++i) {
      if (!(peer.reservedHeld == 0 && takeLanding(p, peer, Grant::Reserved, &slot)) &&
          !takeLanding(p, peer, Grant::Standing, &slot))
        break;
      Endpoint::Grant g{slot.id, slot.addr, {}};
      std::copy(std::begin(slot.rkey), std::end(slot.rkey), std::begin(g.rkey));
      me.grants.push_back(g);
    }
    peer.startHandshake(fd, me.encode());
  } catch (const Error& e) {
    killPeer(p, e.what());
  }
}

}  // namespace roce::transport::verbs
