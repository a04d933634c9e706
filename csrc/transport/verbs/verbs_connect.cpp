// Setting up a peer's queue pairs when its connection arrives, and the
// endpoint exchange over the TCP side channel (see verbs_transport.hpp).
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "../../common/config.hpp"
#include "../../common/error.hpp"
#include "../../common/page_memory.hpp"
#include "../../common/sockets.hpp"
#include "verbs_endpoint.hpp"
#include "verbs_transport.hpp"

namespace roce {

using namespace verbs;

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
  return std::max({cfg.ibQpsPerConnection, cfg.nChannels, maxRails});
}

size_t verbsRegisteredBytes(const Config& cfg, int peers, int rails) {
  const int qps = groupQueuePairs(cfg, rails);
  const size_t stride = (sizeof(SlotHeader) + cfg.ibSlotBytes + 63) & ~size_t(63);
  const size_t landing = pageRound(cfg.ibPoolBytes / stride * stride);
  const size_t staging = pageRound(std::max(cfg.ibPoolBytes / 4, 2 * stride) / stride * stride);
  const size_t perPeer = static_cast<size_t>(qps) *
                         (recvDepth(cfg.ibSlots, 1 << 30) + sendDepth(cfg.ibSlots, 1 << 30)) * kCtrlBytes;
  return static_cast<size_t>(rails) * (landing + staging + static_cast<size_t>(peers) * perPeer);
}

VerbsTransport::VerbsTransport(int rank, int size, Rails rails, const Config& cfg, int qpsPerPeer)
    : rank_(rank), rails_(std::move(rails)) {
  if (rails_.empty() || rails_.size() > static_cast<size_t>(kMaxRails))
    throwInvalid(str("the verbs transport drives 1 to ", kMaxRails, " ports, not ", rails_.size()));
  qpsPerPeer_ = qpsPerPeer;
  cap_ = cfg.ibSlots;
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
    throwInvalid(str(describeRails(), " allows only ", maxWr, " work requests per queue; with ROCE_PG_IB_SLOTS=", cap_,
                     " too few are left for control messages: lower ROCE_PG_IB_SLOTS"));
  zeroCopyMin_ = cfg.ibZeroCopyMinBytes;
  eagerMax_ = cfg.ibEagerMaxBytes;
  regCache_ = std::make_unique<RegCache>(rails_, defaultRegCacheBytes(cfg.ibRegCacheBytes), rank_);
  deviceRegCache_ = std::make_unique<RegCache>(rails_, cfg.ibDeviceRegBytes, rank_, /*overcommit=*/true);
  // Asked before any call could hand over a dma-buf (a failed registration
  // costs microseconds): GPUDirect's choice needs the answer at issue time.
  // (The first rail's answer: the rails of one rank are normally NICs of one kind.)
  if (cfg.gpudirect != "off") dmabuf_ = probeDmabuf(rails_[0]->pd(), rails_[0]->describe());
  else dmabuf_.why = "ROCE_PG_GPUDIRECT=off";
  slotBytes_ = std::min<size_t>(cfg.ibSlotBytes, maxMsg_ - sizeof(SlotHeader));
  stride_ = (sizeof(SlotHeader) + slotBytes_ + 63) & ~size_t(63);
  poolBytes_ = cfg.ibPoolBytes;
  tc_ = cfg.ibTc;
  sl_ = cfg.ibSl;
  timeout_ = cfg.ibTimeout;
  retryCnt_ = cfg.ibRetryCnt;
  peers_.resize(size);
}

std::string VerbsTransport::describeRails() const {
  std::string out;
  for (const auto& dev : rails_) out += (out.empty() ? "" : " and ") + dev->describe();
  return out;
}

VerbsTransport::~VerbsTransport() {
  // Queue pairs before the CQs, pools and registrations they use.
  for (int p : live_) releasePeerResources(*peers_[p]);
  peers_.clear();
}

void VerbsTransport::releasePeerResources(Peer& peer) {
  for (auto& q : peer.qps) {
    ibv_destroy_qp(q.qp);  // returns once its async events were acked (and recorded)
    railOf(q).forget(q.qp);
  }
  peer.qps.clear();
  if (peer.ctrlMrs.registered()) {
    if (counters()) counters()->registeredBytes.fetch_sub(peer.ctrlMrs.bytes(), std::memory_order_relaxed);
    peer.ctrlMrs.deregister();
  }
  unmapPages(peer.ctrlMem, peer.ctrlBytes);
  peer.ctrlMem = nullptr;
  if (peer.sock >= 0) close(peer.sock);
  peer.sock = -1;
}

Peer& VerbsTransport::peerOf(int p) {
  auto& slot = peers_.at(p);
  if (!slot) {
    slot = std::make_unique<Peer>();
    live_.push_back(p);
  }
  return *slot;
}

bool VerbsTransport::needsConnection(int p) const {
  const auto& peer = peers_.at(p);
  return !peer || (peer->sock < 0 && peer->deadReason.empty());
}

void VerbsTransport::ensurePools() {
  if (landing_) return;
  // Registered at the first connection, not at init: a group (or subgroup)
  // that never talks over the network pins nothing.
  for (const auto& dev : rails_) cqs_.push_back(std::make_unique<CqSet>(*dev));
  landing_ = std::make_unique<SlotPool>(rails_, poolBytes_, stride_, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                                        "landing pool", counters());
  // Copied chunks in flight across all peers; a quarter of the landing pool
  // (most large messages go zero copy and need no staging).
  staging_ = std::make_unique<SlotPool>(rails_, std::max(poolBytes_ / 4, 2 * stride_), stride_, IBV_ACCESS_LOCAL_WRITE,
                                        "staging pool", counters());
  landingOwner_.assign(landing_->count(), -1);
  stagingOwner_.assign(staging_->count(), {});
}

void VerbsTransport::setUpQueuePairs(int p, Peer& peer) {
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  peer.ctrlBytes = static_cast<size_t>(qpsPerPeer_) * (rqDepth_ + sqDepth_) * kCtrlBytes;
  peer.ctrlMem = mapPages(peer.ctrlBytes);
  if (!peer.ctrlMem) throwComm(str("out of memory allocating control buffers for rank ", p));
  std::memset(peer.ctrlMem, 0, peer.ctrlBytes);
  peer.ctrlMrs.registerOn(rails_, peer.ctrlMem, peer.ctrlBytes, IBV_ACCESS_LOCAL_WRITE, "control buffers");
  if (counters()) Counters::add(counters()->registeredBytes, peer.ctrlMrs.bytes());
  for (int q = 0; q < qpsPerPeer_; ++q) {
    // Queue pair q on rail q mod rails: chunks spread over queue pairs spread over the ports.
    const int rail = q % static_cast<int>(rails_.size());
    VerbsDevice& dev = *rails_[rail];
    ibv_cq* cq = cqs_[rail]->reserve(sqDepth_ + rqDepth_);
    ibv_qp_init_attr a{};
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = sqDepth_;
    a.cap.max_recv_wr = rqDepth_;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    // Inline sends carry the bytes inside the work request, so the NIC skips
    // one DMA read: used for control messages, zero-copy headers and chunks
    // whose header and payload fit. Providers cap the size differently (and
    // some refuse any), so ask for less until the QP is granted.
    ibv_qp* qp = nullptr;
    for (uint32_t inlineBytes : {kInlineWant, uint32_t(sizeof(Ctrl)), 0u}) {
      a.cap.max_inline_data = inlineBytes;
      if ((qp = ibv_create_qp(dev.pd(), &a))) break;
    }
    if (!qp) throwComm(str("ibv_create_qp for rank ", p, " on ", dev.describe(), " failed: ", std::strerror(errno)));
    Qp entry;
    entry.qp = qp;
    entry.rail = rail;
    entry.maxInline = a.cap.max_inline_data;  // what the provider granted (at least what was asked)
    entry.headerOwner.assign(sqDepth_, nullptr);
    peer.qps.push_back(std::move(entry));
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = 0;
    init.port_num = static_cast<uint8_t>(dev.choice().port);
    init.qp_access_flags = access;
    if (ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
      throwComm(str("moving the queue pair for rank ", p, " to INIT failed on ", dev.describe(), ": ", std::strerror(errno)));
  }
  for (int q = 0; q < qpsPerPeer_; ++q)
    for (int i = 0; i < rqDepth_; ++i) postRecvBuffer(p, q, static_cast<uint32_t>(i));
}

void VerbsTransport::adoptConnection(int p, int fd) {
  Peer& peer = peerOf(p);
  if (!peer.deadReason.empty() || peer.sock >= 0) {
    close(fd);
    return;
  }
  peer.sock = fd;
  setNonBlocking(fd, true);
  try {
    ensurePools();
    setUpQueuePairs(p, peer);
    Endpoint me;
    for (size_t r = 0; r < rails_.size(); ++r) {
      const VerbsDevice& dev = *rails_[r];
      me.rails.push_back({dev.portAttr().lid, dev.gid(), static_cast<int>(dev.portAttr().active_mtu),
                          landing_->rkey(static_cast<int>(r))});
    }
    for (auto& q : peer.qps) me.qps.push_back({q.qp->qp_num, static_cast<uint32_t>(q.rail)});
    peer.localPsn = std::mt19937(std::random_device{}())() & 0xffffff;
    me.psn = peer.localPsn;
    me.landing = landing_->address();
    me.slots = landing_->count();
    me.slotBytes = slotBytes_;
    me.stride = stride_;
    me.ctrlRecvs = static_cast<uint32_t>(rqDepth_ - cap_ - 4);
    const size_t reserve = std::max<size_t>(cap_, landing_->count() / 4);
    for (int i = 0; i < kStandingGrants && landing_->available() > reserve; ++i) {
      const uint32_t slot = landing_->take();
      landingOwner_[slot] = p;
      peer.granted++;
      me.grants.push_back(slot);
    }
    const std::string blob = me.encode();
    const uint32_t len = htonl(static_cast<uint32_t>(blob.size()));
    peer.outbuf.assign(reinterpret_cast<const char*>(&len), sizeof(len));
    peer.outbuf += blob;
    peer.phase = Peer::Phase::Handshake;
    advanceHandshake(p, peer);
  } catch (const Error& e) {
    killPeer(p, e.what());
  }
}

// Non-blocking: writes what is queued for the peer, reads what it sent, and
// moves through the phases as far as the bytes allow. Throws when the peer
// closed the channel or sent garbage.
bool VerbsTransport::advanceHandshake(int p, Peer& peer) {
  bool moved = false;
  while (!peer.outbuf.empty()) {
    const ssize_t n = send(peer.sock, peer.outbuf.data(), peer.outbuf.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) break;  // full (retried next round) or broken (the read below reports it)
    peer.outbuf.erase(0, static_cast<size_t>(n));
    moved = true;
  }
  char buf[1024];
  for (;;) {
    const ssize_t n = recv(peer.sock, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      peer.inbuf.append(buf, static_cast<size_t>(n));
      moved = true;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    throwComm(str("rank ", p, " closed its connection to rank ", rank_, " during the verbs queue-pair setup (",
                  n == 0 ? "EOF" : std::strerror(errno), "): it exited, destroyed the process group or failed to "
                  "set up its end (see that rank's log)"));
  }
  if (peer.phase == Peer::Phase::Handshake && peer.inbuf.size() >= 4) {
    uint32_t len = 0;
    std::memcpy(&len, peer.inbuf.data(), 4);
    len = ntohl(len);
    if (len > 64 * 1024) throwComm(str("rank ", p, " sent a ", len, "-byte verbs endpoint (corrupted handshake)"));
    if (peer.inbuf.size() >= 4 + len) {
      const Endpoint e = Endpoint::parse(peer.inbuf.substr(4, len), p, qpsPerPeer_, rank_);
      peer.inbuf.erase(0, 4 + len);
      connectQueuePairs(p, peer, e);
      // Our queue pairs receive from now on: the peer may start writing.
      peer.outbuf += 'R';
      peer.phase = Peer::Phase::AwaitReady;
      moved = true;
      advanceHandshake(p, peer);  // send the 'R' now
    }
  }
  if (peer.phase == Peer::Phase::AwaitReady && !peer.inbuf.empty()) {
    if (peer.inbuf[0] != 'R' || peer.inbuf.size() > 1)
      throwComm(str("rank ", p, " sent unexpected bytes during the verbs handshake (mixed roce_pg versions?)"));
    peer.inbuf.clear();
    becameReady(p, peer);
    moved = true;
  }
  return moved;
}

void VerbsTransport::becameReady(int p, Peer& peer) {
  (void)p;
  peer.phase = Peer::Phase::Ready;
  peer.inbuf.shrink_to_fit();
  peer.outbuf.shrink_to_fit();
}

void VerbsTransport::connectQueuePairs(int p, Peer& peer, const Endpoint& e) {
  if (e.slotBytes != slotBytes_ || e.stride != stride_)
    throwInvalid(str("rank ", p, " uses verbs slots of ", e.slotBytes, " bytes but rank ", rank_, " uses ", slotBytes_,
                     ": set the same ROCE_PG_IB_SLOT_BYTES on every rank"));
  peer.remoteGid.clear();
  for (const auto& r : e.rails) peer.remoteGid += (peer.remoteGid.empty() ? "" : ", ") + gidToString(r.gid);
  peer.remoteQpn0 = e.qps[0].qpn;
  peer.remoteLanding = e.landing;
  peer.remoteIsFree.assign(e.slots, false);
  for (uint32_t g : e.grants) {
    if (peer.remoteIsFree[g]) throwComm(str("rank ", p, " granted landing slot ", g, " twice (corrupted handshake)"));
    peer.remoteIsFree[g] = true;
    peer.remoteFree.push_back(g);
  }
  peer.ctrlCredits = peer.ctrlCreditsMax = static_cast<int>(e.ctrlRecvs);
  peer.mtu = 0;
  for (size_t q = 0; q < e.qps.size(); ++q) {
    Qp& mine = peer.qps[q];
    const VerbsDevice& dev = railOf(mine);
    const Endpoint::Rail& theirs = e.rails[e.qps[q].rail];
    mine.remoteRail = static_cast<int>(e.qps[q].rail);
    mine.remoteLandingRkey = theirs.landingRkey;
    const ibv_mtu pathMtu = std::min(dev.portAttr().active_mtu, static_cast<ibv_mtu>(theirs.mtu));
    peer.mtu = peer.mtu ? std::min(peer.mtu, mtuToBytes(pathMtu)) : mtuToBytes(pathMtu);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = pathMtu;
    a.dest_qp_num = e.qps[q].qpn;
    a.rq_psn = e.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 31;  // 491.52 ms: see rnr_retry below
    a.ah_attr.port_num = static_cast<uint8_t>(dev.choice().port);
    a.ah_attr.sl = static_cast<uint8_t>(sl_);
    if (dev.choice().ethernet) {
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = theirs.gid;
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev.choice().gidIndex);
      a.ah_attr.grh.hop_limit = 255;
      a.ah_attr.grh.traffic_class = static_cast<uint8_t>(tc_);
    } else {
      a.ah_attr.dlid = static_cast<uint16_t>(theirs.lid);
    }
    int rc = ibv_modify_qp(mine.qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0)
      throwComm(str("moving the queue pair for rank ", p, " to RTR failed: ", std::strerror(rc), " (local ",
                    dev.describe(), "; remote GID ", gidToString(theirs.gid), ", LID ", theirs.lid, ", QPN ",
                    e.qps[q].qpn, ", path MTU ", mtuToBytes(pathMtu), "). A wrong GID index is the usual cause: set "
                    "ROCE_PG_IB_GID_INDEX; with several ports, one the peer's port cannot reach: choose ports with "
                    "ROCE_PG_IB_HCA"));
    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = static_cast<uint8_t>(timeout_);
    s.retry_cnt = static_cast<uint8_t>(retryCnt_);
    // Finite: 7 would retry forever and a peer that stopped re-posting
    // receives would hang us silently. Flow control keeps RNR from happening
    // at all; if it does, 6 retries of min_rnr_timer (491 ms) end in an error.
    s.rnr_retry = 6;
    s.sq_psn = peer.localPsn;
    s.max_rd_atomic = 1;
    rc = ibv_modify_qp(mine.qp, &s,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc != 0) throwComm(str("moving the queue pair for rank ", p, " to RTS failed: ", std::strerror(rc)));
  }
}

}  // namespace roce
