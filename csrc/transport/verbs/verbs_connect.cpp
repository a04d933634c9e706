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

size_t verbsRegisteredBytes(const Config& cfg, int peers) {
  const int qps = std::max(cfg.ibQpsPerConnection, cfg.nChannels);
  const size_t stride = (sizeof(SlotHeader) + cfg.ibSlotBytes + 63) & ~size_t(63);
  const size_t landing = pageRound(cfg.ibPoolBytes / stride * stride);
  const size_t staging = pageRound(std::max(cfg.ibPoolBytes / 4, 2 * stride) / stride * stride);
  const size_t perPeer = static_cast<size_t>(qps) *
                         (recvDepth(cfg.ibSlots, 1 << 30) + sendDepth(cfg.ibSlots, 1 << 30)) * kCtrlBytes;
  return landing + staging + static_cast<size_t>(peers) * perPeer;
}

VerbsTransport::VerbsTransport(int rank, int size, std::shared_ptr<VerbsDevice> dev, const Config& cfg)
    : rank_(rank), dev_(std::move(dev)) {
  // At least one queue pair per channel (cfg.nChannels is the group's, resolved).
  qpsPerPeer_ = std::max(cfg.ibQpsPerConnection, cfg.nChannels);
  cap_ = cfg.ibSlots;
  const int maxWr = dev_->deviceAttr().max_qp_wr;
  // Send: room for every chunk of the peer's cap in zero copy (two WRs each)
  // beside the control messages. Receive: every queue pair may receive all of
  // a peer's chunks in flight; queue pair 0 also takes the control messages.
  sqDepth_ = sendDepth(cap_, maxWr);
  rqDepth_ = recvDepth(cap_, maxWr);
  if (rqDepth_ - cap_ - 4 < kCtrlReserve + 4 || sqDepth_ < 2 * cap_ + 8)
    throwInvalid(str(dev_->describe(), " allows only ", maxWr, " work requests per queue; with ROCE_PG_IB_SLOTS=", cap_,
                     " too few are left for control messages: lower ROCE_PG_IB_SLOTS"));
  maxMsg_ = dev_->maxMsgSize();
  zeroCopyMin_ = cfg.ibZeroCopyMinBytes;
  eagerMax_ = cfg.ibEagerMaxBytes;
  regCache_ = std::make_unique<RegCache>(*dev_, defaultRegCacheBytes(cfg.ibRegCacheBytes), rank_);
  deviceRegCache_ = std::make_unique<RegCache>(*dev_, cfg.ibDeviceRegBytes, rank_, /*overcommit=*/true);
  // Asked before any call could hand over a dma-buf (a failed registration
  // costs microseconds): GPUDirect's choice needs the answer at issue time.
  if (cfg.gpudirect != "off") dmabuf_ = probeDmabuf(dev_->pd(), dev_->describe());
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

VerbsTransport::~VerbsTransport() {
  // Queue pairs before the CQs, pools and registrations they use.
  for (int p : live_) releasePeerResources(*peers_[p]);
  peers_.clear();
}

void VerbsTransport::releasePeerResources(Peer& peer) {
  for (auto& q : peer.qps) {
    ibv_destroy_qp(q.qp);  // returns once its async events were acked (and recorded)
    dev_->forget(q.qp);
  }
  peer.qps.clear();
  if (peer.ctrlMr) {
    ibv_dereg_mr(peer.ctrlMr);
    if (counters()) counters()->registeredBytes.fetch_sub(peer.ctrlBytes, std::memory_order_relaxed);
    peer.ctrlMr = nullptr;
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
  cqs_ = std::make_unique<CqSet>(*dev_);
  landing_ = std::make_unique<SlotPool>(*dev_, poolBytes_, stride_, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                                        "landing pool", counters());
  // Copied chunks in flight across all peers; a quarter of the landing pool
  // (most large messages go zero copy and need no staging).
  staging_ = std::make_unique<SlotPool>(*dev_, std::max(poolBytes_ / 4, 2 * stride_), stride_, IBV_ACCESS_LOCAL_WRITE,
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
  peer.ctrlMr = dev_->registerMemory(peer.ctrlMem, peer.ctrlBytes, IBV_ACCESS_LOCAL_WRITE, "control buffers");
  if (counters()) Counters::add(counters()->registeredBytes, peer.ctrlBytes);
  ibv_cq* cq = cqs_->reserve(qpsPerPeer_ * (sqDepth_ + rqDepth_));
  for (int q = 0; q < qpsPerPeer_; ++q) {
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
      if ((qp = ibv_create_qp(dev_->pd(), &a))) break;
    }
    if (!qp) throwComm(str("ibv_create_qp for rank ", p, " on ", dev_->describe(), " failed: ", std::strerror(errno)));
    Qp entry;
    entry.qp = qp;
    entry.maxInline = a.cap.max_inline_data;  // what the provider granted (at least what was asked)
    entry.headerOwner.assign(sqDepth_, nullptr);
    peer.qps.push_back(std::move(entry));
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = 0;
    init.port_num = static_cast<uint8_t>(dev_->choice().port);
    init.qp_access_flags = access;
    if (ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
      throwComm(str("moving the queue pair for rank ", p, " to INIT failed on ", dev_->describe(), ": ", std::strerror(errno)));
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
    for (auto& q : peer.qps) me.qpns.push_back(q.qp->qp_num);
    peer.localPsn = std::mt19937(std::random_device{}())() & 0xffffff;
    me.psn = peer.localPsn;
    me.lid = dev_->portAttr().lid;
    me.gid = dev_->gid();
    me.mtu = static_cast<int>(dev_->portAttr().active_mtu);
    me.landing = landing_->address();
    me.rkey = landing_->rkey();
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
  peer.remoteGid = gidToString(e.gid);
  peer.remoteQpn0 = e.qpns[0];
  peer.remoteLanding = e.landing;
  peer.remoteRkey = e.rkey;
  peer.remoteIsFree.assign(e.slots, false);
  for (uint32_t g : e.grants) {
    if (peer.remoteIsFree[g]) throwComm(str("rank ", p, " granted landing slot ", g, " twice (corrupted handshake)"));
    peer.remoteIsFree[g] = true;
    peer.remoteFree.push_back(g);
  }
  peer.ctrlCredits = peer.ctrlCreditsMax = static_cast<int>(e.ctrlRecvs);
  const ibv_mtu pathMtu = std::min(dev_->portAttr().active_mtu, static_cast<ibv_mtu>(e.mtu));
  peer.mtu = mtuToBytes(pathMtu);
  for (size_t q = 0; q < e.qpns.size(); ++q) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = pathMtu;
    a.dest_qp_num = e.qpns[q];
    a.rq_psn = e.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 31;  // 491.52 ms: see rnr_retry below
    a.ah_attr.port_num = static_cast<uint8_t>(dev_->choice().port);
    a.ah_attr.sl = static_cast<uint8_t>(sl_);
    if (dev_->choice().ethernet) {
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = e.gid;
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev_->choice().gidIndex);
      a.ah_attr.grh.hop_limit = 255;
      a.ah_attr.grh.traffic_class = static_cast<uint8_t>(tc_);
    } else {
      a.ah_attr.dlid = static_cast<uint16_t>(e.lid);
    }
    int rc = ibv_modify_qp(peer.qps[q].qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0)
      throwComm(str("moving the queue pair for rank ", p, " to RTR failed: ", std::strerror(rc), " (local ",
                    dev_->describe(), "; remote GID ", peer.remoteGid, ", LID ", e.lid, ", QPN ", e.qpns[q],
                    ", path MTU ", peer.mtu, "). A wrong GID index is the usual cause: set ROCE_PG_IB_GID_INDEX"));
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
    rc = ibv_modify_qp(peer.qps[q].qp, &s,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc != 0) throwComm(str("moving the queue pair for rank ", p, " to RTS failed: ", std::strerror(rc)));
  }
}

}  // namespace roce
