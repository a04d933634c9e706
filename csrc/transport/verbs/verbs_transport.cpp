#include "verbs_transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "../../common/bootstrap.hpp"
#include "../../common/config.hpp"
#include "../../common/error.hpp"

namespace roce {

// ---- wire formats -----------------------------------------------------------

// kAck only returns control credits (when there is nothing else to carry them).
enum CtrlType : uint32_t { kRts = 1, kRtr = 2, kCredit = 3, kNack = 4, kAck = 5 };

struct VerbsTransport::Ctrl {
  uint32_t type;
  uint32_t id;       // RTR/NACK: receive id; CREDIT: slot
  uint64_t tag;
  uint64_t len;      // RTS/RTR: message size; NACK: the sender's size
  uint32_t credits;  // control receives the sender re-posted since its last message
  uint32_t rkey;     // RTR with addr: rkey of the receive buffer
  uint64_t addr;     // RTR: receive buffer for zero copy; 0: copy through landing slots
  uint64_t piece;    // RTR with addr: bytes per RDMA write; the receiver counts pieces of this size
  uint64_t pad[2];
};
static_assert(sizeof(VerbsTransport::Ctrl) == 64);

// Written into a landing slot by the WRITE_WITH_IMM that completes a chunk.
constexpr uint64_t kSlotZeroCopy = 1;  // the payload went straight into the receive buffer
constexpr uint64_t kSlotEager = 2;     // a whole small message sent without waiting for an RTR (recvId 0)
struct SlotHeader {
  uint64_t recvId;
  uint64_t offset;
  uint64_t len;
  uint64_t flags;
  uint64_t tag;     // eager: the message's tag (the receiver pairs it with a receive)
  uint64_t pad[3];
};
static_assert(sizeof(SlotHeader) == 64);

namespace {

constexpr int kCtrlBytes = 64;  // one receive buffer / one control send slot
// Inline bytes asked of each queue pair: a slot header and up to 192 bytes of payload.
constexpr uint32_t kInlineWant = 256;
// Control credits kept back for kAck, so that two ranks that have used up
// their credits can always return each other's.
constexpr int kCtrlReserve = 2;

// wr_id: kind | peer | qp | index
// kWrZeroCopy: an unsignaled payload write; completes only with an error.
enum WrKind : uint64_t { kWrCtrl = 1, kWrData = 2, kWrRecv = 3, kWrZeroCopy = 4 };
uint64_t wrId(WrKind k, int peer, int qp, uint32_t index) {
  return (static_cast<uint64_t>(k) << 56) | (static_cast<uint64_t>(peer & 0xffffff) << 32) |
         (static_cast<uint64_t>(qp & 0xff) << 24) | (index & 0xffffff);
}
WrKind wrKind(uint64_t id) { return static_cast<WrKind>(id >> 56); }
int wrPeer(uint64_t id) { return static_cast<int>((id >> 32) & 0xffffff); }
int wrQp(uint64_t id) { return static_cast<int>((id >> 24) & 0xff); }
uint32_t wrIndex(uint64_t id) { return static_cast<uint32_t>(id & 0xffffff); }

char* allocRegion(size_t bytes) {
  bytes = (bytes + 4095) & ~size_t(4095);
  void* p = std::aligned_alloc(4096, bytes);
  if (!p) throwComm(str("out of memory allocating ", bytes, " bytes of RDMA buffers"));
  std::memset(p, 0, bytes);  // touch the pages before they are pinned
  return static_cast<char*>(p);
}

std::string hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    uint8_t b = static_cast<const uint8_t*>(p)[i];
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

bool unhex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

// One endpoint as published in the store by a peer; every field is checked
// before it is used to address the peer's memory or configure a queue pair.
struct RemoteEndpoint {
  std::vector<uint32_t> qpns;
  uint32_t psn = 0;
  uint32_t lid = 0;
  ibv_gid gid{};
  int mtu = 0;
  uint64_t landing = 0;
  uint32_t rkey = 0;
  uint32_t slots = 0;
  uint64_t slotBytes = 0, stride = 0;
  uint32_t ctrlRecvs = 0;  // control messages it can take before returning credits
};

RemoteEndpoint parseEndpoint(const std::string& text, int peer, int expectQps, int self) {
  std::istringstream in(text);
  auto fail = [&](const std::string& what) -> RemoteEndpoint {
    throwComm(str("rank ", peer, " published an invalid verbs endpoint (", what,
                  "): mixed roce_pg versions across ranks, or another program writing this group's store keys"));
  };
  auto next = [&](uint64_t lo, uint64_t hi, const char* what) -> uint64_t {
    std::string tok;
    if (!(in >> tok) || tok.empty() || tok.size() > 20 || tok.find_first_not_of("0123456789") != std::string::npos)
      fail(str(what, " missing or not a number"));
    uint64_t v = 0;
    for (char ch : tok) {
      if (v > (UINT64_MAX - 9) / 10) fail(str(what, " out of range"));
      v = v * 10 + static_cast<uint64_t>(ch - '0');
    }
    if (v < lo || v > hi) fail(str(what, "=", v, " outside [", lo, ", ", hi, "]"));
    return v;
  };
  RemoteEndpoint e;
  const auto nq = static_cast<int>(next(1, 16, "queue pair count"));
  if (nq != expectQps)
    throwInvalid(str("rank ", peer, " uses ", nq, " queue pairs per connection but rank ", self, " uses ",
                     expectQps, " (the larger of ROCE_PG_IB_QPS_PER_CONNECTION and the channel count): set the same "
                     "ROCE_PG_IB_QPS_PER_CONNECTION on every rank"));
  for (int q = 0; q < nq; ++q) e.qpns.push_back(static_cast<uint32_t>(next(1, 0xffffff, "QPN")));
  e.psn = static_cast<uint32_t>(next(0, 0xffffff, "PSN"));
  e.lid = static_cast<uint32_t>(next(0, 0xffff, "LID"));
  std::string gidHex;
  if (!(in >> gidHex) || !unhex(gidHex, e.gid.raw, 16)) fail("GID");
  e.mtu = static_cast<int>(next(IBV_MTU_256, IBV_MTU_4096, "MTU"));
  e.landing = next(1, UINT64_MAX, "landing address");
  e.rkey = static_cast<uint32_t>(next(0, UINT32_MAX, "rkey"));
  e.slots = static_cast<uint32_t>(next(2, 256, "slot count"));
  e.slotBytes = next(1, 1ull << 30, "slot size");
  e.stride = next(sizeof(SlotHeader) + e.slotBytes, 1ull << 31, "slot stride");
  if (e.stride % 64) fail("slot stride not 64-byte aligned");
  e.ctrlRecvs = static_cast<uint32_t>(next(kCtrlReserve + 4, 1 << 20, "control receive count"));
  return e;
}

}  // namespace

// ---- per-peer state ----------------------------------------------------------

struct VerbsTransport::Qp {
  ibv_qp* qp = nullptr;
  int posted = 0;                  // send WRs not yet known complete
  int unsignaled = 0;              // send WRs since the last signaled one
  std::deque<int> covers;          // per signaled WR in flight: WRs it retires
  uint64_t ctrlSent = 0;           // index into the control send ring
  uint32_t maxInline = 0;          // bytes a send may carry inline (IBV_SEND_INLINE); 0: none
};

struct VerbsTransport::Arrival {
  bool eager;
  uint64_t len;
  std::vector<char> data;  // eager payload, when no receive was waiting
};

struct VerbsTransport::Peer {
  ~Peer() {
    // Queue pairs first: once destroyed, the NIC touches none of the memory below.
    for (auto& q : qps) ibv_destroy_qp(q.qp);
    for (ibv_mr* mr : {ctrlMr, stagingMr, landingMr})
      if (mr) ibv_dereg_mr(mr);
    std::free(ctrlMem);
    std::free(staging);
    std::free(landing);
  }
  std::vector<Qp> qps;
  std::string deadReason;
  std::string remoteGid;
  uint32_t remoteQpn0 = 0;
  uint32_t localPsn = 0;  // our send PSN, published to the peer as its receive PSN
  int mtu = 0;
  // Memory registered once: receive buffers + control send ring, staging, landing.
  char* ctrlMem = nullptr;
  ibv_mr* ctrlMr = nullptr;
  char* staging = nullptr;
  ibv_mr* stagingMr = nullptr;
  char* landing = nullptr;
  ibv_mr* landingMr = nullptr;
  // The peer's landing area.
  uint64_t remoteLanding = 0;
  uint32_t remoteRkey = 0;
  size_t remoteSlotBytes = 0, remoteStride = 0;
  std::deque<uint32_t> remoteFree;       // its landing slots we may write (credits)
  std::vector<bool> remoteIsFree;        // per slot: in remoteFree (a duplicate CREDIT is an error)
  // Control-message flow control: SENDs on QP 0 each consume one of the peer's
  // posted receives, so we send only while we hold credits for them (no RNR).
  int ctrlCredits = 0;
  int ctrlCreditsMax = 0;
  uint32_t ctrlToReturn = 0;             // our control receives re-posted, not yet reported
  std::vector<uint32_t> stagingFree;     // our staging slots not in flight
  std::vector<struct ActiveSend*> stagingOwner;
  // Sender side matching: per tag, sends in posting order still waiting for
  // their receive's RTR (the k-th RTR belongs to the k-th send). An eager send
  // waits too, although its data may be gone already: the RTR carries the
  // receive's size, and the send completes (or fails on a size mismatch, as a
  // rendezvous send does) only once both its write and the RTR are in.
  struct WaitingSend {
    Request* r;
    struct ActiveSend* eager;  // non-null for an eager send (in `active`)
  };
  std::unordered_map<uint64_t, std::deque<WaitingSend>> sendsWaiting;
  std::unordered_map<uint64_t, std::deque<Ctrl>> rtrsWaiting;
  std::list<struct ActiveSend> active;
  // What announces each send to the receiver, in posting order on QP 0: an
  // RTS for a rendezvous send, the data itself for an eager one. The receiver
  // pairs these with its receives per tag in the same order, so they must not
  // overtake each other (other control messages may pass them).
  struct Announcement {
    Ctrl rts;
    struct ActiveSend* eager = nullptr;  // non-null: the eager send to write (in `active`)
  };
  std::deque<Announcement> announcements;
  // Receiver side.
  struct RecvState {
    Request* r;
    uint64_t expected;          // chunks (pieces in zero-copy mode); 0 until the mode is known
    uint64_t got;
    std::vector<bool> seen;     // per chunk: a duplicate would complete the receive with a hole
    RegCache::Entry* zc = nullptr;  // zero copy offered: the receive buffer's registration
    uint64_t piece = 0;             // zero-copy piece size announced in the RTR
    int mode = 0;                   // 0: not yet known (zero copy offered), 1: copy, 2: zero copy
  };
  std::unordered_map<uint32_t, RecvState> recvs;
  // Pairing per tag, k-th announcement with k-th receive: what arrived with no
  // receive posted yet (an RTS, or an eager message copied out of its landing
  // slot), and receives posted with no announcement yet.
  std::unordered_map<uint64_t, std::deque<Arrival>> arrivals;
  std::unordered_map<uint64_t, std::deque<uint32_t>> unannounced;
  uint32_t nextRecvId = 1;
  std::deque<Ctrl> ctrlQueue;
  uint32_t nextQp = 0;
};

struct ActiveSend {
  Request* r;
  uint32_t recvId;  // 0: eager (posted from the announcement queue, not by streamSends)
  uint64_t chunks, posted = 0, done = 0;
  // Eager only: the receive's RTR arrived; the size mismatch it revealed, if any.
  bool matched = false;
  std::string mismatch;
  // Zero copy (zc non-null): pieces of `piece` bytes go to remoteAddr/rkey.
  RegCache::Entry* zc = nullptr;
  uint64_t piece = 0, remoteAddr = 0;
  uint32_t rkey = 0;
};

// ---- setup -----------------------------------------------------------------

VerbsTransport::VerbsTransport(int rank, std::shared_ptr<VerbsDevice> dev, const Config& cfg, Bootstrap& bs,
                               const std::vector<bool>& serve, std::chrono::steady_clock::time_point deadline,
                               std::chrono::milliseconds timeout)
    : rank_(rank), dev_(std::move(dev)) {
  // At least one queue pair per channel (cfg.nChannels is the group's, resolved).
  qpsPerPeer_ = std::max(cfg.ibQpsPerConnection, cfg.nChannels);
  slots_ = cfg.ibSlots;
  sqDepth_ = std::min(256, dev_->deviceAttr().max_qp_wr);
  rqDepth_ = std::min(2 * slots_ + 128, dev_->deviceAttr().max_qp_wr);
  if (ctrlRecvs() < kCtrlReserve + 4)
    throwInvalid(str(dev_->describe(), " allows only ", dev_->deviceAttr().max_qp_wr, " work requests per queue; with "
                     "ROCE_PG_IB_SLOTS=", slots_, " too few are left for control messages: lower ROCE_PG_IB_SLOTS"));
  const size_t maxMsg = dev_->maxMsgSize();
  maxMsg_ = maxMsg;
  zeroCopyMin_ = cfg.ibZeroCopyMinBytes;
  eagerMax_ = cfg.ibEagerMaxBytes;
  regCache_ = std::make_unique<RegCache>(*dev_, defaultRegCacheBytes(cfg.ibRegCacheBytes), rank_);
  slotBytes_ = std::min<size_t>(cfg.chunkBytes, maxMsg - sizeof(SlotHeader));
  stride_ = (sizeof(SlotHeader) + slotBytes_ + 63) & ~size_t(63);
  tc_ = cfg.ibTc;
  sl_ = cfg.ibSl;
  timeout_ = cfg.ibTimeout;
  retryCnt_ = cfg.ibRetryCnt;

  int served = 0;
  for (bool s : serve) served += s;
  const int cqe = std::max(64, served * qpsPerPeer_ * (sqDepth_ + rqDepth_));
  channel_.reset(ibv_create_comp_channel(dev_->context()));
  if (channel_) {
    // Non-blocking, so that consuming an event never blocks the progress thread.
    int fl = fcntl(channel_->fd, F_GETFL);
    if (fl < 0 || fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK) != 0) channel_.reset();
  }
  cq_.reset(ibv_create_cq(dev_->context(), std::min(cqe, dev_->deviceAttr().max_cqe), nullptr, channel_.get(), 0));
  if (!cq_) throwComm(str("ibv_create_cq(", cqe, ") on ", dev_->describe(), " failed: ", std::strerror(errno),
                          " (if ENOMEM: raise the memlock limit, `ulimit -l unlimited`)"));
  peers_.resize(serve.size());
  for (size_t p = 0; p < serve.size(); ++p)
    if (serve[p]) setUpPeer(static_cast<int>(p));

  // Publish one endpoint per peer, then connect with what the peer published.
  std::mt19937 rng(std::random_device{}());
  for (size_t p = 0; p < serve.size(); ++p) {
    if (!serve[p]) continue;
    Peer& peer = *peers_[p];
    std::ostringstream os;
    os << qpsPerPeer_;
    for (auto& q : peer.qps) os << " " << q.qp->qp_num;
    ibv_gid gid = dev_->gid();
    peer.localPsn = rng() & 0xffffff;
    os << " " << peer.localPsn << " " << dev_->portAttr().lid << " " << hex(gid.raw, 16) << " "
       << static_cast<int>(dev_->portAttr().active_mtu) << " " << reinterpret_cast<uint64_t>(peer.landing) << " "
       << peer.landingMr->rkey << " " << slots_ << " " << slotBytes_ << " " << stride_ << " " << ctrlRecvs();
    bs.set(str("verbs/", rank_, "/", p), os.str());
  }
  for (size_t p = 0; p < serve.size(); ++p) {
    if (!serve[p]) continue;
    auto v = waitForKeys(bs, {str("verbs/", p, "/", rank_)}, deadline, timeout, "verbs connection setup",
                         [&](size_t) { return str("rank ", p, " (its RDMA queue pairs)"); });
    connectPeer(static_cast<int>(p), v[0]);
  }
  // Nobody sends before its peer's queue pairs are ready to receive.
  for (size_t p = 0; p < serve.size(); ++p)
    if (serve[p]) bs.set(str("verbs/ready/", rank_, "/", p), "1");
  for (size_t p = 0; p < serve.size(); ++p) {
    if (!serve[p]) continue;
    waitForKeys(bs, {str("verbs/ready/", p, "/", rank_)}, deadline, timeout, "verbs connection setup",
                [&](size_t) { return str("rank ", p, " (bringing its queue pairs to RTS)"); });
  }
}

void VerbsTransport::setUpPeer(int p) {
  auto peer = std::make_unique<Peer>();
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  const size_t ctrlBytes = static_cast<size_t>(qpsPerPeer_) * (rqDepth_ + sqDepth_) * kCtrlBytes;
  peer->ctrlMem = allocRegion(ctrlBytes);
  peer->ctrlMr = dev_->registerMemory(peer->ctrlMem, ctrlBytes, IBV_ACCESS_LOCAL_WRITE, "control buffers");
  peer->staging = allocRegion(slots_ * stride_);
  peer->stagingMr = dev_->registerMemory(peer->staging, slots_ * stride_, IBV_ACCESS_LOCAL_WRITE, "send staging");
  peer->landing = allocRegion(slots_ * stride_);
  peer->landingMr = dev_->registerMemory(peer->landing, slots_ * stride_, access, "receive landing slots");
  for (int s = slots_ - 1; s >= 0; --s) peer->stagingFree.push_back(static_cast<uint32_t>(s));
  peer->stagingOwner.assign(slots_, nullptr);
  for (int q = 0; q < qpsPerPeer_; ++q) {
    ibv_qp_init_attr a{};
    a.send_cq = cq_.get();
    a.recv_cq = cq_.get();
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = sqDepth_;
    a.cap.max_recv_wr = rqDepth_;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    // Inline sends carry the bytes inside the work request, so the NIC skips
    // one DMA read: used for control messages and for chunks whose header and
    // payload fit (an 8-byte allreduce's). Providers cap the size differently
    // (and some refuse any), so ask for less until the QP is granted.
    ibv_qp* qp = nullptr;
    for (uint32_t inlineBytes : {kInlineWant, uint32_t(sizeof(Ctrl)), 0u}) {
      a.cap.max_inline_data = inlineBytes;
      if ((qp = ibv_create_qp(dev_->pd(), &a))) break;
    }
    if (!qp) throwComm(str("ibv_create_qp for rank ", p, " on ", dev_->describe(), " failed: ", std::strerror(errno)));
    Qp entry;
    entry.qp = qp;
    entry.maxInline = a.cap.max_inline_data;  // what the provider granted (at least what was asked)
    peer->qps.push_back(entry);
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = 0;
    init.port_num = static_cast<uint8_t>(dev_->choice().port);
    init.qp_access_flags = access;
    if (ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
      throwComm(str("moving the queue pair for rank ", p, " to INIT failed on ", dev_->describe(), ": ", std::strerror(errno)));
  }
  peers_[p] = std::move(peer);
  for (int q = 0; q < qpsPerPeer_; ++q)
    for (int i = 0; i < rqDepth_; ++i) postRecvBuffer(p, q, static_cast<uint32_t>(i));
}

void VerbsTransport::connectPeer(int p, const std::string& remote) {
  Peer& peer = *peers_[p];
  const RemoteEndpoint e = parseEndpoint(remote, p, qpsPerPeer_, rank_);
  const int nq = static_cast<int>(e.qpns.size());
  const auto& qpns = e.qpns;
  const uint32_t psn = e.psn;
  const uint32_t lid = e.lid;
  const int mtu = e.mtu;
  const ibv_gid gid = e.gid;
  peer.remoteGid = gidToString(gid);
  peer.remoteQpn0 = qpns[0];
  peer.remoteLanding = e.landing;
  peer.remoteRkey = e.rkey;
  peer.remoteSlotBytes = e.slotBytes;
  peer.remoteStride = e.stride;
  for (uint32_t s = 0; s < e.slots; ++s) peer.remoteFree.push_back(s);
  peer.remoteIsFree.assign(e.slots, true);
  peer.ctrlCredits = peer.ctrlCreditsMax = static_cast<int>(e.ctrlRecvs);
  const ibv_mtu pathMtu = std::min(dev_->portAttr().active_mtu, static_cast<ibv_mtu>(mtu));
  peer.mtu = mtuToBytes(pathMtu);
  for (int q = 0; q < nq; ++q) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = pathMtu;
    a.dest_qp_num = qpns[q];
    a.rq_psn = psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 31;  // 491.52 ms: see rnr_retry below
    a.ah_attr.port_num = static_cast<uint8_t>(dev_->choice().port);
    a.ah_attr.sl = static_cast<uint8_t>(sl_);
    if (dev_->choice().ethernet) {
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = gid;
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev_->choice().gidIndex);
      a.ah_attr.grh.hop_limit = 255;
      a.ah_attr.grh.traffic_class = static_cast<uint8_t>(tc_);
    } else {
      a.ah_attr.dlid = static_cast<uint16_t>(lid);
    }
    int rc = ibv_modify_qp(peer.qps[q].qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0)
      throwComm(str("moving the queue pair for rank ", p, " to RTR failed: ", std::strerror(rc), " (local ",
                    dev_->describe(), "; remote GID ", peer.remoteGid, ", LID ", lid, ", QPN ", qpns[q],
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

VerbsTransport::~VerbsTransport() {
  peers_.clear();  // queue pairs before the completion queue they use
  cq_.reset();
}

void VerbsTransport::CqDeleter::operator()(ibv_cq* cq) const { ibv_destroy_cq(cq); }
void VerbsTransport::ChannelDeleter::operator()(ibv_comp_channel* ch) const { ibv_destroy_comp_channel(ch); }

int VerbsTransport::ctrlRecvs() const {
  // QP 0's receives also take data chunks (at most slots_ in flight); a few more are kept spare.
  return rqDepth_ - slots_ - 4;
}

// ---- posting -----------------------------------------------------------------

void VerbsTransport::postRecvBuffer(int p, int q, int index) {
  Peer& peer = *peers_[p];
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(peer.ctrlMem + (static_cast<size_t>(q) * rqDepth_ + index) * kCtrlBytes);
  sge.length = kCtrlBytes;
  sge.lkey = peer.ctrlMr->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = wrId(kWrRecv, p, q, static_cast<uint32_t>(index));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  int rc = ibv_post_recv(peer.qps[q].qp, &wr, &bad);
  if (rc != 0) throwComm(str("ibv_post_recv for rank ", p, " failed (", rc, ") on ", dev_->describe()));
}

void VerbsTransport::queueCtrl(int p, const Ctrl& msg) {
  peers_[p]->ctrlQueue.push_back(msg);
  flushCtrl(p);
}

bool VerbsTransport::flushCtrl(int p) {
  Peer& peer = *peers_[p];
  Qp& q = peer.qps[0];  // control messages keep their order on QP 0
  bool moved = false;
  // Return credits explicitly when nothing else will carry them soon: once
  // enough piled up and the queue is empty, or at once when this side is down
  // to its reserve (its queued messages cannot go, and the peer may be in the
  // same state waiting for these very credits).
  const bool stuck = peer.ctrlCredits <= kCtrlReserve && peer.ctrlToReturn > 0;
  const bool idle = peer.ctrlQueue.empty() &&
                    peer.ctrlToReturn >= static_cast<uint32_t>(std::max(1, peer.ctrlCreditsMax / 4));
  if ((stuck || idle) && (peer.ctrlQueue.empty() || peer.ctrlQueue.front().type != kAck))
    peer.ctrlQueue.push_front(Ctrl{kAck, 0, 0, 0, 0, 0});
  while (!peer.ctrlQueue.empty() && q.posted < sqDepth_) {
    const bool ack = peer.ctrlQueue.front().type == kAck;
    if (peer.ctrlCredits <= (ack ? 0 : kCtrlReserve)) break;  // the peer has no receive posted for more
    postCtrl(p, peer.ctrlQueue.front());
    peer.ctrlQueue.pop_front();
    moved = true;
  }
  return moved;
}

// One control SEND on QP 0 (the caller checked credits and queue room); it
// also returns the control receives re-posted since the last one.
void VerbsTransport::postCtrl(int p, Ctrl msg) {
  Peer& peer = *peers_[p];
  Qp& q = peer.qps[0];
  msg.credits = peer.ctrlToReturn;
  const uint64_t ring = q.ctrlSent++ % static_cast<uint64_t>(sqDepth_);
  char* buf = peer.ctrlMem + (static_cast<size_t>(qpsPerPeer_) * rqDepth_ + ring) * kCtrlBytes;
  std::memcpy(buf, &msg, sizeof(msg));
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), sizeof(msg), peer.ctrlMr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wrId(kWrCtrl, p, 0, 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  // Signal only every so often: one completion retires all earlier sends.
  const bool signal = q.unsignaled + 1 >= sqDepth_ / 4;
  wr.send_flags = (signal ? IBV_SEND_SIGNALED : 0) | (sizeof(msg) <= q.maxInline ? IBV_SEND_INLINE : 0);
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(q.qp, &wr, &bad);
  if (rc != 0) throwComm(str("ibv_post_send (control) to rank ", p, " failed (", rc, ") on ", dev_->describe()));
  q.posted++;
  if (signal) {
    q.covers.push_back(q.unsignaled + 1);
    q.unsignaled = 0;
  } else {
    q.unsignaled++;
  }
  peer.ctrlToReturn = 0;
  peer.ctrlCredits--;
}

// Posts the queued announcements in order: an RTS takes a control credit, an
// eager message a landing slot of the peer and a staging slot here. The first
// that cannot go holds back the rest (order matters); flushCtrl's messages do
// not wait for them.
bool VerbsTransport::flushAnnouncements(int p) {
  Peer& peer = *peers_[p];
  Qp& q = peer.qps[0];
  bool moved = false;
  while (!peer.announcements.empty() && q.posted < sqDepth_) {
    Peer::Announcement& a = peer.announcements.front();
    if (!a.eager) {
      if (peer.ctrlCredits <= kCtrlReserve) break;
      postCtrl(p, a.rts);
    } else {
      if (peer.remoteFree.empty() || peer.stagingFree.empty()) break;
      const Request& r = *a.eager->r;
      SlotHeader h{0, 0, r.len, kSlotEager, r.tag, {}};
      postChunk(p, q, *a.eager, h, static_cast<const char*>(r.buf));
      if (counters()) Counters::add(counters()->eagerSends, 1);
    }
    peer.announcements.pop_front();
    moved = true;
  }
  return moved;
}

size_t VerbsTransport::chunkFor(const Peer& p) const { return std::min(slotBytes_, p.remoteSlotBytes); }

size_t VerbsTransport::eagerLimit(const Peer& p) const { return std::min(eagerMax_, chunkFor(p)); }

void VerbsTransport::postSend(Request* r) {
  Peer& peer = *peers_.at(r->peer);
  if (!peer.deadReason.empty()) return r->fail(peer.deadReason);
  ActiveSend* eager = nullptr;
  if (r->len <= eagerLimit(peer)) {
    peer.active.push_back(ActiveSend{r, 0, 1});
    eager = &peer.active.back();
  }
  auto it = peer.rtrsWaiting.find(r->tag);
  if (it != peer.rtrsWaiting.end() && !it->second.empty()) {
    const Ctrl rtr = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) peer.rtrsWaiting.erase(it);
    if (eager) matchEager(r->peer, *eager, rtr);
    else matchSend(r->peer, r, rtr);
  } else {
    peer.sendsWaiting[r->tag].push_back({r, eager});
  }
  peer.announcements.push_back({Ctrl{kRts, 0, r->tag, r->len, 0, 0}, eager});
  flushAnnouncements(r->peer);
}

// The RTR of the receive an eager send fills: only the sizes are compared (the
// data goes to the landing slot regardless, so that the receiver pairs its
// receives in order and reports the mismatch too).
void VerbsTransport::matchEager(int p, ActiveSend& as, const Ctrl& rtr) {
  as.matched = true;
  if (rtr.len != as.r->len)
    as.mismatch = str("rank ", rank_, " sent ", as.r->len, " bytes to rank ", p, " but rank ", p, " expected ",
                      rtr.len, " bytes: every rank must pass tensors of the same size and dtype to this operation");
  if (as.done == as.chunks) finishSend(p, as);
}

// A send whose chunks are all written (and, if eager, whose RTR arrived).
void VerbsTransport::finishSend(int p, ActiveSend& as) {
  Peer& peer = *peers_[p];
  regCache_->release(as.zc);
  if (as.mismatch.empty()) as.r->done = true;
  else as.r->fail(as.mismatch);
  for (auto it = peer.active.begin(); it != peer.active.end(); ++it)
    if (&*it == &as) { peer.active.erase(it); break; }
}

void VerbsTransport::postRecv(Request* r) {
  Peer& peer = *peers_.at(r->peer);
  if (!peer.deadReason.empty()) return r->fail(peer.deadReason);
  // Ids wrap after 2^32 receives: skip any still in use by a long-pending one.
  uint32_t id;
  do {
    id = peer.nextRecvId++;
  } while (id == 0 || peer.recvs.count(id));
  // Every receive sends an RTR, even one an eager message will fill: the
  // sender consumes RTRs strictly in order per tag.
  if (RegCache::Entry* zc = registerUserBuffer(*r)) {
    // Offer zero copy; the sender may still copy (its buffer is not registered).
    const uint64_t piece = zeroCopyPiece(r->len, r->lane > 0 ? 1 : qpsPerPeer_);
    peer.recvs[id] = {r, 0, 0, {}, zc, piece, 0};
    queueCtrl(r->peer, Ctrl{kRtr, id, r->tag, r->len, 0, zc->mr->rkey, reinterpret_cast<uint64_t>(r->buf), piece, {}});
  } else {
    const uint64_t chunk = chunkFor(peer);
    const uint64_t chunks = std::max<uint64_t>(1, (r->len + chunk - 1) / chunk);
    peer.recvs[id] = {r, chunks, 0, std::vector<bool>(chunks, false), nullptr, 0, 1};
    queueCtrl(r->peer, Ctrl{kRtr, id, r->tag, r->len, 0, 0, 0, 0, {}});
  }
  auto a = peer.arrivals.find(r->tag);
  if (a == peer.arrivals.end()) return void(peer.unannounced[r->tag].push_back(id));
  Arrival first = std::move(a->second.front());
  a->second.pop_front();
  if (a->second.empty()) peer.arrivals.erase(a);
  if (first.eager) deliverEager(r->peer, id, first.data.data(), first.len);
  // An RTS: the data follows, addressed to this receive's id.
}

// An eager message paired with receive `id`: copy it in and complete the
// receive (the sender never writes to it by id).
void VerbsTransport::deliverEager(int p, uint32_t id, const char* data, uint64_t len) {
  Peer& peer = *peers_[p];
  auto it = peer.recvs.find(id);
  if (it == peer.recvs.end()) return;  // failed already (NACK): nothing to fill
  Request* r = it->second.r;
  regCache_->release(it->second.zc);
  peer.recvs.erase(it);
  if (len != r->len)
    return r->fail(str("rank ", rank_, " expected a message of ", r->len, " bytes from rank ", p, " but rank ", p,
                       " sent ", len, " bytes: every rank must pass tensors of the same size and dtype to this operation"));
  if (len) std::memcpy(r->buf, data, len);
  countCopied(len);
  r->done = true;
}

RegCache::Entry* VerbsTransport::registerUserBuffer(const Request& r) {
  if (zeroCopyMin_ == 0 || r.len < zeroCopyMin_ || !r.owner) return nullptr;
  regCache_->setCounters(counters());
  return regCache_->acquire(r.owner, r.buf, r.len);
}

uint64_t VerbsTransport::zeroCopyPiece(uint64_t len, int qps) const {
  // Spread a message over the queue pairs it may use (one for a channel's),
  // but keep pieces large (each costs a landing-slot credit and a control
  // message back); never above max_msg_sz.
  const uint64_t perQp = (len + qps - 1) / qps;
  const uint64_t piece = std::max<uint64_t>(256 << 10, (perQp + 4095) & ~uint64_t(4095));
  return std::min<uint64_t>({piece, maxMsg_, uint64_t(1) << 30});
}

// The sender's next message on `tag` was announced (RTS) or arrived (eager,
// payload at `eagerData`): pair it with the oldest receive still waiting for
// one, or keep it (copied, for eager) until a receive is posted.
void VerbsTransport::announce(int p, uint64_t tag, Arrival a, const char* eagerData) {
  Peer& peer = *peers_[p];
  auto w = peer.unannounced.find(tag);
  if (w != peer.unannounced.end()) {
    const uint32_t id = w->second.front();
    w->second.pop_front();
    if (w->second.empty()) peer.unannounced.erase(w);
    if (a.eager) deliverEager(p, id, eagerData, a.len);
    return;
  }
  if (a.eager) {
    a.data.assign(eagerData, eagerData + a.len);
    countCopied(a.len);
  }
  peer.arrivals[tag].push_back(std::move(a));
}

bool VerbsTransport::hasUnmatched(int peer, uint64_t tag) {
  if (!peers_.at(peer)) return false;
  return peers_[peer]->arrivals.count(tag) > 0;  // entries are erased when empty
}

void VerbsTransport::matchSend(int p, Request* r, const Ctrl& rtr) {
  Peer& peer = *peers_[p];
  const uint32_t recvId = rtr.id;
  const uint64_t len = rtr.len;
  if (len != r->len) {
    r->fail(str("rank ", rank_, " sent ", r->len, " bytes to rank ", p, " but rank ", p, " expected ", len,
                " bytes: every rank must pass tensors of the same size and dtype to this operation"));
    queueCtrl(p, Ctrl{kNack, recvId, r->tag, r->len, 0, 0});
    return;
  }
  ActiveSend as{r, recvId, 0};
  // Zero copy when the receiver offered it and our buffer registers too.
  if (rtr.addr != 0 && rtr.piece >= 4096 && rtr.piece <= maxMsg_ && rtr.piece <= (uint64_t(1) << 30))
    as.zc = registerUserBuffer(*r);
  if (as.zc) {
    as.piece = rtr.piece;
    as.chunks = (r->len + as.piece - 1) / as.piece;
    as.remoteAddr = rtr.addr;
    as.rkey = rtr.rkey;
  } else {
    const uint64_t chunk = chunkFor(peer);
    as.chunks = std::max<uint64_t>(1, (r->len + chunk - 1) / chunk);
  }
  peer.active.push_back(as);
}

bool VerbsTransport::streamSends(int p) {
  Peer& peer = *peers_[p];
  bool moved = false;
  const uint64_t chunk = chunkFor(peer);
  for (auto& as : peer.active) {
    if (as.recvId == 0) continue;  // eager: posted by flushAnnouncements
    // A channel's messages keep to its own queue pair (one ECMP path per
    // ring); others are spread chunk by chunk.
    const bool pinned = as.r->lane > 0;
    while (as.posted < as.chunks && !peer.remoteFree.empty() && !peer.stagingFree.empty()) {
      Qp& q = peer.qps[(pinned ? as.r->lane - 1u : peer.nextQp) % peer.qps.size()];
      if (q.posted + (as.zc ? 2 : 1) > sqDepth_) {
        if (pinned) break;  // the other channels' queue pairs may have room
        return moved;
      }
      if (!pinned) peer.nextQp++;
      const uint64_t step = as.zc ? as.piece : chunk;
      const uint64_t offset = as.posted * step;
      const uint64_t len = std::min<uint64_t>(step, as.r->len - std::min(as.r->len, offset));
      SlotHeader h{as.recvId, offset, len, as.zc ? kSlotZeroCopy : 0, 0, {}};
      postChunk(p, q, as, h, static_cast<const char*>(as.r->buf) + offset);
      moved = true;
    }
  }
  return moved;
}

// Writes one chunk into a free landing slot of the peer through a free
// staging slot here (the caller checked both, and room on q): header and
// copied payload in one WRITE_WITH_IMM, or, in zero-copy mode, the payload by
// RDMA_WRITE from the registered tensor first and then the header alone.
void VerbsTransport::postChunk(int p, Qp& q, ActiveSend& as, const SlotHeader& h, const char* payload) {
  Peer& peer = *peers_[p];
  const uint32_t slot = peer.stagingFree.back();
  const uint32_t land = peer.remoteFree.front();
  char* dst = peer.staging + slot * stride_;
  std::memcpy(dst, &h, sizeof(h));
  ibv_send_wr wrs[2]{};
  ibv_sge sges[2]{};
  ibv_send_wr& head = as.zc ? wrs[1] : wrs[0];
  ibv_sge& headSge = as.zc ? sges[1] : sges[0];
  if (as.zc) {
    // The payload, tensor to tensor, unsignaled: the header's completion
    // (same queue pair, posted after it) covers it.
    sges[0] = ibv_sge{reinterpret_cast<uint64_t>(payload), static_cast<uint32_t>(h.len), as.zc->mr->lkey};
    wrs[0].wr_id = wrId(kWrZeroCopy, p, static_cast<int>(&q - peer.qps.data()), slot);
    wrs[0].sg_list = &sges[0];
    wrs[0].num_sge = 1;
    wrs[0].opcode = IBV_WR_RDMA_WRITE;
    wrs[0].wr.rdma.remote_addr = as.remoteAddr + h.offset;
    wrs[0].wr.rdma.rkey = as.rkey;
    wrs[0].next = &wrs[1];
    headSge = ibv_sge{reinterpret_cast<uint64_t>(dst), static_cast<uint32_t>(sizeof(h)), peer.stagingMr->lkey};
    if (counters()) Counters::add(counters()->bytesZeroCopy, h.len);
  } else {
    if (h.len) std::memcpy(dst + sizeof(h), payload, h.len);
    countCopied(h.len);
    headSge = ibv_sge{reinterpret_cast<uint64_t>(dst), static_cast<uint32_t>(sizeof(h) + h.len), peer.stagingMr->lkey};
  }
  head.wr_id = wrId(kWrData, p, static_cast<int>(&q - peer.qps.data()), slot);
  head.sg_list = &headSge;
  head.num_sge = 1;
  head.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  head.send_flags = IBV_SEND_SIGNALED;  // frees the staging slot
  if (headSge.length <= q.maxInline) head.send_flags |= IBV_SEND_INLINE;  // a tiny chunk, or a zero-copy header
  head.imm_data = htonl(land);
  head.wr.rdma.remote_addr = peer.remoteLanding + land * peer.remoteStride;
  head.wr.rdma.rkey = peer.remoteRkey;
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(q.qp, &wrs[0], &bad);
  if (rc != 0) throwComm(str("ibv_post_send (RDMA write) to rank ", p, " failed (", rc, ") on ", dev_->describe()));
  const int n = as.zc ? 2 : 1;
  q.posted += n;
  q.covers.push_back(q.unsignaled + n);
  q.unsignaled = 0;
  peer.stagingFree.pop_back();
  peer.remoteFree.pop_front();
  peer.remoteIsFree[land] = false;
  peer.stagingOwner[slot] = &as;
  as.posted++;
}

// ---- completions ---------------------------------------------------------------

void VerbsTransport::retire(Qp& q) {
  if (q.covers.empty()) return;
  q.posted -= q.covers.front();
  q.covers.pop_front();
}

std::string VerbsTransport::failureText(int p, const ibv_wc& wc) const {
  const Peer& peer = *peers_[p];
  std::string hint;
  if (wc.status == IBV_WC_RETRY_EXC_ERR)
    hint = " The peer never acknowledged although the TCP bootstrap reached it: usually a wrong GID index "
           "(set ROCE_PG_IB_GID_INDEX to the RoCE v2 GID of the interface the peers can reach; `show_gids`), "
           "a VLAN/routing problem, or an MTU mismatch along the path.";
  else if (wc.status == IBV_WC_RNR_RETRY_EXC_ERR)
    hint = " The peer had no receive posted for too long (it may be stuck or gone).";
  else if (wc.status == IBV_WC_REM_ACCESS_ERR || wc.status == IBV_WC_LOC_PROT_ERR)
    hint = " A memory registration was rejected (mixed roce_pg versions across ranks?).";
  return str("RDMA transfer with rank ", p, " failed: ", ibv_wc_status_str(wc.status), " (status ", wc.status,
             ", vendor error 0x", std::hex, wc.vendor_err, std::dec, ") on ", dev_->describe(), "; remote GID ",
             peer.remoteGid, ", remote QPN ", peer.remoteQpn0, ", path MTU ", peer.mtu, ".", hint);
}

void VerbsTransport::onCompletion(const ibv_wc& wc) {
  const int p = wrPeer(wc.wr_id);
  if (p < 0 || p >= static_cast<int>(peers_.size()) || !peers_[p]) return;
  Peer& peer = *peers_[p];
  if (!peer.deadReason.empty()) return;  // flushed or late work of a failed peer: nothing refers to it
  if (wc.status != IBV_WC_SUCCESS) {
    // Only wr_id, status, qp_num and vendor_err are valid here.
    return killPeer(p, failureText(p, wc));
  }
  switch (wrKind(wc.wr_id)) {
    case kWrCtrl:
      retire(peer.qps[wrQp(wc.wr_id)]);
      break;
    case kWrZeroCopy:  // never signaled: nothing to do on success
      break;
    case kWrData: {
      retire(peer.qps[wrQp(wc.wr_id)]);
      const uint32_t slot = wrIndex(wc.wr_id);
      ActiveSend* as = peer.stagingOwner[slot];
      peer.stagingOwner[slot] = nullptr;
      peer.stagingFree.push_back(slot);
      if (as && ++as->done == as->chunks && (as->recvId != 0 || as->matched)) finishSend(p, *as);
      break;
    }
    case kWrRecv: {
      const int q = wrQp(wc.wr_id);
      const uint32_t index = wrIndex(wc.wr_id);
      const bool data = wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM;
      if (data) {
        onData(p, ntohl(wc.imm_data), wc.byte_len);
      } else if (wc.byte_len != sizeof(Ctrl)) {
        return killPeer(p, str("rank ", p, " sent a ", wc.byte_len, "-byte control message (expected ", sizeof(Ctrl),
                               "; mixed roce_pg versions across ranks?)"));
      } else {
        Ctrl msg;
        std::memcpy(&msg, peer.ctrlMem + (static_cast<size_t>(q) * rqDepth_ + index) * kCtrlBytes, sizeof(msg));
        onCtrl(p, msg);
      }
      if (!peer.deadReason.empty()) break;
      postRecvBuffer(p, q, static_cast<int>(index));
      if (!data) peer.ctrlToReturn++;  // this receive is posted again: the sender may use it
      break;
    }
  }
}

void VerbsTransport::onCtrl(int p, const Ctrl& msg) {
  Peer& peer = *peers_[p];
  if (msg.credits > static_cast<uint32_t>(peer.ctrlCreditsMax - peer.ctrlCredits))
    return killPeer(p, str("rank ", p, " returned more control credits than it was given (",
                           msg.credits, "): corrupted control message"));
  peer.ctrlCredits += static_cast<int>(msg.credits);
  switch (msg.type) {
    case kAck:
      break;
    case kRts:
      announce(p, msg.tag, Arrival{false, msg.len, {}});
      break;
    case kRtr: {
      auto it = peer.sendsWaiting.find(msg.tag);
      if (it != peer.sendsWaiting.end() && !it->second.empty()) {
        const Peer::WaitingSend w = it->second.front();
        it->second.pop_front();
        if (it->second.empty()) peer.sendsWaiting.erase(it);
        if (w.eager) matchEager(p, *w.eager, msg);
        else matchSend(p, w.r, msg);
      } else {
        peer.rtrsWaiting[msg.tag].push_back(msg);
      }
      break;
    }
    case kCredit:
      if (msg.id >= peer.remoteIsFree.size() || peer.remoteIsFree[msg.id])
        return killPeer(p, str("rank ", p, " returned landing slot ", msg.id, " which it ",
                               msg.id >= peer.remoteIsFree.size() ? "does not have" : "had not been given",
                               " (corrupted control message)"));
      peer.remoteIsFree[msg.id] = true;
      peer.remoteFree.push_back(msg.id);
      break;
    case kNack: {
      auto it = peer.recvs.find(msg.id);
      if (it == peer.recvs.end()) break;
      Request* r = it->second.r;
      regCache_->release(it->second.zc);  // the sender never wrote into it
      peer.recvs.erase(it);
      r->fail(str("rank ", rank_, " expected a message of ", r->len, " bytes from rank ", p, " but rank ", p,
                  " sent ", msg.len, " bytes: every rank must pass tensors of the same size and dtype to this operation"));
      break;
    }
    default:
      killPeer(p, str("unknown control message ", msg.type, " from rank ", p, " (mixed roce_pg versions?)"));
  }
}

void VerbsTransport::onData(int p, uint32_t slot, uint32_t byteLen) {
  Peer& peer = *peers_[p];
  // Everything here comes from the peer: the slot from the immediate, the rest
  // from the header it wrote. Any inconsistency fails the peer; nothing is
  // copied and the receive cannot complete with a hole.
  if (slot >= static_cast<uint32_t>(slots_))
    return killPeer(p, str("rank ", p, " wrote to landing slot ", slot, " of ", slots_, " (corrupted immediate)"));
  // byte_len of a WRITE_WITH_IMM is what the peer wrote; 0 means the provider does not report it.
  if (byteLen != 0 && (byteLen < sizeof(SlotHeader) || byteLen > stride_))
    return killPeer(p, str("rank ", p, " wrote ", byteLen, " bytes into a landing slot of ", stride_));
  const char* src = peer.landing + slot * stride_;
  SlotHeader h;
  std::memcpy(&h, src, sizeof(h));
  if (h.flags & kSlotEager) {
    if (h.flags != kSlotEager || h.recvId != 0 || h.offset != 0 || h.len > chunkFor(peer) ||
        (byteLen != 0 && h.len != byteLen - sizeof(SlotHeader)))
      return killPeer(p, str("rank ", p, " sent an inconsistent eager message (length ", h.len, ", ", byteLen,
                             " bytes written, flags ", h.flags, "): corrupted slot header"));
    announce(p, h.tag, Arrival{true, h.len, {}}, src + sizeof(h));
    queueCtrl(p, Ctrl{kCredit, slot, 0, 0, 0, 0});
    return;
  }
  auto it = h.recvId <= UINT32_MAX ? peer.recvs.find(static_cast<uint32_t>(h.recvId)) : peer.recvs.end();
  if (it == peer.recvs.end())
    return killPeer(p, str("rank ", p, " sent a chunk for receive ", h.recvId, ", which rank ", rank_,
                           " has not posted (corrupted slot header)"));
  auto& st = it->second;
  const bool zc = h.flags & kSlotZeroCopy;
  if (st.mode == 0) {  // zero copy was offered: the first chunk says what the sender chose
    st.mode = zc ? 2 : 1;
    const uint64_t step = zc ? st.piece : chunkFor(peer);
    st.expected = std::max<uint64_t>(1, (st.r->len + step - 1) / step);
    st.seen.assign(st.expected, false);
  }
  if ((st.mode == 2) != zc || (h.flags & ~kSlotZeroCopy))
    return killPeer(p, str("rank ", p, " sent a chunk in ", zc ? "zero-copy" : "copy", " mode for a receive in the other "
                           "mode (flags ", h.flags, "; corrupted slot header or mixed roce_pg versions)"));
  const uint64_t chunk = zc ? st.piece : chunkFor(peer);
  const uint64_t index = h.offset / chunk;
  const uint64_t expectLen = st.r->len > h.offset ? std::min(chunk, st.r->len - h.offset) : 0;
  // In zero-copy mode only the header was written into the slot.
  const uint64_t inSlot = zc ? 0 : h.len;
  const bool ok = h.offset % chunk == 0 && index < st.expected && !st.seen[index] && h.len == expectLen &&
                  (byteLen == 0 || inSlot == byteLen - sizeof(SlotHeader));
  if (!ok)
    return killPeer(p, str("rank ", p, " sent an inconsistent chunk for a ", st.r->len, "-byte receive (offset ",
                           h.offset, ", length ", h.len, ", ", byteLen, " bytes written, chunk size ", chunk,
                           st.seen.size() > index && st.seen[index] ? ", already received" : "",
                           "): corrupted slot header"));
  st.seen[index] = true;
  if (!zc) {
    if (h.len) std::memcpy(static_cast<char*>(st.r->buf) + h.offset, src + sizeof(h), h.len);
    countCopied(h.len);
  }
  if (++st.got == st.expected) {
    regCache_->release(st.zc);
    st.r->done = true;
    peer.recvs.erase(it);
  }
  queueCtrl(p, Ctrl{kCredit, slot, 0, 0, 0, 0});
}

bool VerbsTransport::progress() {
  bool moved = false;
  ibv_wc wcs[32];
  for (;;) {
    int n = ibv_poll_cq(cq_.get(), 32, wcs);
    if (n < 0) {
      failAll(str("ibv_poll_cq failed on ", dev_->describe()));
      return true;
    }
    for (int i = 0; i < n; ++i) {
      try {
        onCompletion(wcs[i]);
      } catch (const std::exception& e) {
        // Re-posting a receive or a control message failed: the queue pair is
        // unusable, so is the peer; nothing may escape the progress thread.
        const int p = wrPeer(wcs[i].wr_id);
        if (p >= 0 && p < static_cast<int>(peers_.size()) && peers_[p]) killPeer(p, e.what());
      }
    }
    moved |= n > 0;
    if (n < 32) break;
  }
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (!peers_[p] || !peers_[p]->deadReason.empty()) continue;
    try {
      moved |= flushCtrl(static_cast<int>(p));
      moved |= flushAnnouncements(static_cast<int>(p));
      moved |= streamSends(static_cast<int>(p));
    } catch (const std::exception& e) {
      killPeer(static_cast<int>(p), e.what());
    }
  }
  return moved;
}

bool VerbsTransport::prepareWait(std::vector<pollfd>& fds, bool anySource) {
  (void)anySource;  // every arrival is a completion, announced like the rest
  if (!channel_) return false;
  // Every event the transport waits for is a completion on cq_: the peer's
  // control messages and chunks (receives), and the send completions that free
  // queue slots. Re-arming an armed CQ is harmless, so arm unconditionally.
  if (ibv_req_notify_cq(cq_.get(), 0) != 0) return false;
  armed_ = true;
  fds.push_back(pollfd{channel_->fd, POLLIN, 0});
  return true;
}

void VerbsTransport::afterWait() {
  if (!armed_) return;
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  unsigned events = 0;
  while (ibv_get_cq_event(channel_.get(), &cq, &ctx) == 0) ++events;  // EAGAIN ends it
  if (events) {
    ibv_ack_cq_events(cq_.get(), events);  // before the CQ can be destroyed
    armed_ = false;
  }
}

std::string VerbsTransport::checkPeers() {
  if (std::string e = dev_->asyncError(); !e.empty()) {
    failAll(e);
    return e;
  }
  for (auto& p : peers_)
    if (p && !p->deadReason.empty()) return p->deadReason;
  return {};
}

void VerbsTransport::killPeer(int p, const std::string& why) {
  Peer& peer = *peers_[p];
  if (peer.deadReason.empty()) {
    peer.deadReason = why;
    // Stop the NIC from touching this peer's buffers any further; the flushed
    // work requests complete with errors that onCompletion ignores.
    for (auto& q : peer.qps) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      ibv_modify_qp(q.qp, &a, IBV_QP_STATE);
    }
  }
  for (auto& [tag, q] : peer.sendsWaiting)
    for (const Peer::WaitingSend& w : q)
      if (!w.eager) w.r->fail(why);  // eager sends are in `active`, failed below
  peer.sendsWaiting.clear();
  peer.announcements.clear();
  peer.arrivals.clear();
  peer.unannounced.clear();
  // The queue pairs are in the error state (above): the NIC no longer reads or
  // writes these buffers, so their registrations may be reused or dropped.
  for (auto& as : peer.active) {
    regCache_->release(as.zc);
    as.r->fail(why);
  }
  peer.active.clear();
  std::fill(peer.stagingOwner.begin(), peer.stagingOwner.end(), nullptr);
  for (auto& [id, st] : peer.recvs) {
    regCache_->release(st.zc);
    st.r->fail(why);
  }
  peer.recvs.clear();
  peer.ctrlQueue.clear();
}

void VerbsTransport::failAll(const std::string& why) {
  for (size_t p = 0; p < peers_.size(); ++p)
    if (peers_[p]) killPeer(static_cast<int>(p), why);
}

}  // namespace roce
