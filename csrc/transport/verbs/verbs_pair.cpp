// A pair's connection and posting (see verbs_pair.hpp): its queue pairs and
// control rings, the endpoint handshake over the side channel, control
// messages under the peer's credits, and what its completions retire.
#include "verbs_pair.hpp"

#include <arpa/inet.h>
#include <cstdint>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../../common/error.hpp"
#include "../../common/page_memory.hpp"
#include "verbs_device.hpp"
#include "verbs_endpoint.hpp"

namespace roce::transport::verbs {

void Pair::setUp(std::vector<std::unique_ptr<CqSet>>& cqs) {
  // Remote reads reach only memory registered for them: exposed windows.
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ctrlBytes = static_cast<size_t>(shape_.qps) * (shape_.rqDepth + shape_.sqDepth) * kCtrlBytes;
  ctrlMem = mapPages(ctrlBytes);
  if (!ctrlMem) throwComm(str("out of memory allocating control buffers for rank ", peer_));
  std::memset(ctrlMem, 0, ctrlBytes);
  ctrlMrs.registerOn(rails_, ctrlMem, ctrlBytes, IBV_ACCESS_LOCAL_WRITE, "control buffers");
  if (counters_) Counters::add(counters_->registeredBytes, ctrlMrs.bytes());
  for (int q = 0; q < shape_.qps; ++q) {
    // Queue pair q on rail q mod rails: chunks spread over queue pairs spread over the ports.
    const int rail = q % static_cast<int>(rails_.size());
    VerbsDevice& dev = *rails_[rail];
    ibv_cq* cq = cqs[rail]->reserve(shape_.sqDepth + shape_.rqDepth);
    ibv_qp_init_attr a{};
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = shape_.sqDepth;
    a.cap.max_recv_wr = shape_.rqDepth;
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
    if (!qp) throwComm(str("ibv_create_qp for rank ", peer_, " on ", dev.describe(), " failed: ", std::strerror(errno)));
    Qp entry;
    entry.qp = qp;
    entry.rail = rail;
    entry.maxInline = a.cap.max_inline_data;  // what the provider granted (at least what was asked)
    entry.headerOwner.assign(shape_.sqDepth, nullptr);
    qps.push_back(std::move(entry));
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = 0;
    init.port_num = static_cast<uint8_t>(dev.choice().port);
    init.qp_access_flags = access;
    if (ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
      throwComm(str("moving the queue pair for rank ", peer_, " to INIT failed on ", dev.describe(), ": ",
                    std::strerror(errno)));
  }
  for (int q = 0; q < shape_.qps; ++q)
    for (int i = 0; i < shape_.rqDepth; ++i) postRecv(q, i);
}

void Pair::release() {
  for (auto& q : qps) {
    ibv_destroy_qp(q.qp);  // returns once its async events were acked (and recorded)
    railOf(q).forget(q.qp);
  }
  qps.clear();
  if (ctrlMrs.registered()) {
    if (counters_) counters_->registeredBytes.fetch_sub(ctrlMrs.bytes(), std::memory_order_relaxed);
    ctrlMrs.deregister();
  }
  unmapPages(ctrlMem, ctrlBytes);
  ctrlMem = nullptr;
  if (sock >= 0) close(sock);
  sock = -1;
}

void Pair::forgetCounters() {
  if (counters_ && ctrlMrs.registered()) counters_->registeredBytes.fetch_sub(ctrlMrs.bytes(), std::memory_order_relaxed);
  counters_ = nullptr;
}

void Pair::toError() {
  for (auto& q : qps) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(q.qp, &a, IBV_QP_STATE);
    std::fill(q.headerOwner.begin(), q.headerOwner.end(), nullptr);
  }
}

void Pair::startHandshake(int fd, const std::string& endpoint) {
  sock = fd;
  const uint32_t len = htonl(static_cast<uint32_t>(endpoint.size()));
  outbuf.assign(reinterpret_cast<const char*>(&len), sizeof(len));
  outbuf += endpoint;
  phase = Phase::Handshake;
  advanceHandshake();
}

bool Pair::advanceHandshake() {
  bool moved = false;
  while (!outbuf.empty()) {
    const ssize_t n = send(sock, outbuf.data(), outbuf.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) break;  // full (retried next round) or broken (the read below reports it)
    outbuf.erase(0, static_cast<size_t>(n));
    moved = true;
  }
  char buf[1024];
  // A peer that finished first closes the socket right after its last byte
  // (the socket is no longer needed once both ends are ready): that byte
  // counts, the EOF fails the setup only if the setup is not complete.
  std::string closed;
  for (;;) {
    const ssize_t n = recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      inbuf.append(buf, static_cast<size_t>(n));
      moved = true;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    closed = n == 0 ? "EOF" : std::strerror(errno);
    break;
  }
  if (phase == Phase::Handshake && inbuf.size() >= 4) {
    uint32_t len = 0;
    std::memcpy(&len, inbuf.data(), 4);
    len = ntohl(len);
    if (len > 64 * 1024) throwComm(str("rank ", peer_, " sent a ", len, "-byte verbs endpoint (corrupted handshake)"));
    if (inbuf.size() >= 4 + len) {
      const Endpoint e = Endpoint::parse(inbuf.substr(4, len), peer_, shape_.qps, shape_.rank);
      inbuf.erase(0, 4 + len);
      connect(e);
      // Our queue pairs receive from now on: the peer may start writing.
      outbuf += 'R';
      phase = Phase::AwaitReady;
      moved = true;
      advanceHandshake();  // send the 'R' now
    }
  }
  if (phase == Phase::AwaitReady && !inbuf.empty()) {
    if (inbuf[0] != 'R' || inbuf.size() > 1)
      throwComm(str("rank ", peer_, " sent unexpected bytes during the verbs handshake (mixed roce_pg versions?)"));
    inbuf.clear();
    phase = Phase::Ready;
    inbuf.shrink_to_fit();
    outbuf.shrink_to_fit();
    moved = true;
  }
  if (!closed.empty() && phase != Phase::Ready)
    throwComm(str("rank ", peer_, " closed its connection to rank ", shape_.rank, " during the verbs queue-pair setup (",
                  closed, "): it exited, destroyed the process group or failed to set up its end (see that rank's log)"));
  return moved;
}

void Pair::connect(const Endpoint& e) {
  if (e.slotBytes != shape_.slotBytes || e.stride != shape_.stride)
    throwInvalid(str("rank ", peer_, " uses verbs slots of ", e.slotBytes, " bytes but rank ", shape_.rank, " uses ",
                     shape_.slotBytes, ": set the same ROCE_PG_IB_SLOT_BYTES on every rank"));
  remoteGid.clear();
  for (const auto& r : e.rails) remoteGid += (remoteGid.empty() ? "" : ", ") + gidToString(r.gid);
  remoteQpn0 = e.qps[0].qpn;
  for (const auto& g : e.grants) addCredit(g.id, g.addr, g.rkey, e.rails.size());  // parse() refused duplicates
  ctrlCredits = ctrlCreditsMax = static_cast<int>(e.ctrlRecvs);
  mtu = 0;
  for (size_t q = 0; q < e.qps.size(); ++q) {
    Qp& mine = qps[q];
    const VerbsDevice& dev = railOf(mine);
    const Endpoint::Rail& theirs = e.rails[e.qps[q].rail];
    mine.remoteRail = static_cast<int>(e.qps[q].rail);
    const ibv_mtu pathMtu = std::min(dev.portAttr().active_mtu, static_cast<ibv_mtu>(theirs.mtu));
    mtu = mtu ? std::min(mtu, mtuToBytes(pathMtu)) : mtuToBytes(pathMtu);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = pathMtu;
    a.dest_qp_num = e.qps[q].qpn;
    a.rq_psn = e.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 31;  // 491.52 ms: see rnr_retry below
    a.ah_attr.port_num = static_cast<uint8_t>(dev.choice().port);
    a.ah_attr.sl = static_cast<uint8_t>(shape_.sl);
    if (dev.choice().ethernet) {
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = theirs.gid;
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev.choice().gidIndex);
      a.ah_attr.grh.hop_limit = 255;
      a.ah_attr.grh.traffic_class = static_cast<uint8_t>(shape_.tc);
    } else {
      a.ah_attr.dlid = static_cast<uint16_t>(theirs.lid);
    }
    int rc = ibv_modify_qp(mine.qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0)
      throwComm(str("moving the queue pair for rank ", peer_, " to RTR failed: ", std::strerror(rc), " (local ",
                    dev.describe(), "; remote GID ", gidToString(theirs.gid), ", LID ", theirs.lid, ", QPN ",
                    e.qps[q].qpn, ", path MTU ", mtuToBytes(pathMtu), "). A wrong GID index is the usual cause: set "
                    "ROCE_PG_IB_GID_INDEX; with several ports, one the peer's port cannot reach: choose ports with "
                    "ROCE_PG_IB_HCA"));
    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = static_cast<uint8_t>(shape_.timeout);
    s.retry_cnt = static_cast<uint8_t>(shape_.retryCnt);
    // Finite: 7 would retry forever and a peer that stopped re-posting
    // receives would hang us silently. Flow control keeps RNR from happening
    // at all; if it does, 6 retries of min_rnr_timer (491 ms) end in an error.
    s.rnr_retry = 6;
    s.sq_psn = localPsn;
    s.max_rd_atomic = 1;
    rc = ibv_modify_qp(mine.qp, &s,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc != 0) throwComm(str("moving the queue pair for rank ", peer_, " to RTS failed: ", std::strerror(rc)));
  }
}

void Pair::postRecv(int q, int index) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(recvBuffer(q, static_cast<uint32_t>(index)));
  sge.length = kCtrlBytes;
  sge.lkey = ctrlMrs.lkey(qps[q].rail);
  ibv_recv_wr wr{};
  wr.wr_id = wrId(kWrRecv, peer_, q, static_cast<uint32_t>(index));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  int rc = ibv_post_recv(qps[q].qp, &wr, &bad);
  if (rc != 0) throwComm(str("ibv_post_recv for rank ", peer_, " failed (", rc, ") on ", railOf(qps[q]).describe()));
}

uint32_t Pair::takeRingEntry(Qp& q) {
  // An entry is reused sqDepth posts later; a queue pair never has more than
  // sqDepth send WRs in flight (q.posted), so it is no longer in use then.
  return static_cast<uint32_t>(q.ringNext++ % static_cast<uint64_t>(shape_.sqDepth));
}

void Pair::retire(Qp& q) {
  if (q.covers.empty()) return;
  q.posted -= q.covers.front();
  q.covers.pop_front();
}

void Pair::addCredit(uint32_t id, uint64_t addr, const uint32_t* rkeys, size_t rails) {
  RemoteSlot slot{id, addr, {}};
  std::copy(rkeys, rkeys + rails, slot.rkey.begin());
  remoteHeld.insert(id);
  remoteFree.push_back(slot);
}

void Pair::queueCtrl(const Ctrl& msg) {
  ctrlQueue.push_back(msg);
  flushCtrl();
}

bool Pair::flushCtrl() {
  if (!ready()) return false;  // queued until the peer's queue pairs receive
  Qp& q = qps[0];              // control messages keep their order on QP 0
  bool moved = false;
  // Return credits explicitly when nothing else will carry them soon: once
  // enough piled up and the queue is empty, or at once when this side is down
  // to its reserve (its queued messages cannot go, and the peer may be in the
  // same state waiting for these very credits).
  const bool stuck = ctrlCredits <= kCtrlReserve && ctrlToReturn > 0;
  const bool idle = ctrlQueue.empty() && ctrlToReturn >= static_cast<uint32_t>(std::max(1, ctrlCreditsMax / 4));
  if ((stuck || idle) && (ctrlQueue.empty() || ctrlQueue.front().type != kAck)) ctrlQueue.push_front(makeCtrl(kAck));
  while (!ctrlQueue.empty() && q.posted < shape_.sqDepth) {
    const bool ack = ctrlQueue.front().type == kAck;
    if (ctrlCredits <= (ack ? 0 : kCtrlReserve)) break;  // the peer has no receive posted for more
    postCtrl(ctrlQueue.front());
    ctrlQueue.pop_front();
    moved = true;
  }
  return moved;
}

// One control SEND on QP 0 (the caller checked credits and queue room); it
// also returns the control receives re-posted since the last one.
void Pair::postCtrl(Ctrl msg) {
  Qp& q = qps[0];
  msg.credits = ctrlToReturn;
  const uint32_t entry = takeRingEntry(q);
  char* buf = sendRingEntry(0, entry);
  std::memcpy(buf, &msg, sizeof(msg));
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), sizeof(msg), ctrlMrs.lkey(q.rail)};
  ibv_send_wr wr{};
  wr.wr_id = wrId(kWrCtrl, peer_, 0, entry);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  // Signal only every so often: one completion retires all earlier sends.
  const bool signal = q.unsignaled + 1 >= shape_.sqDepth / 4;
  wr.send_flags = (signal ? IBV_SEND_SIGNALED : 0) | (sizeof(msg) <= q.maxInline ? IBV_SEND_INLINE : 0);
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(q.qp, &wr, &bad);
  if (rc != 0) throwComm(str("ibv_post_send (control) to rank ", peer_, " failed (", rc, ") on ", railOf(q).describe()));
  q.posted++;
  if (signal) {
    q.covers.push_back(q.unsignaled + 1);
    q.unsignaled = 0;
  } else {
    q.unsignaled++;
  }
  ctrlToReturn = 0;
  ctrlCredits--;
}

std::string Pair::failureText(const ibv_wc& wc) const {
  std::string hint;
  if (wc.status == IBV_WC_RETRY_EXC_ERR)
    hint = " The peer never acknowledged although the TCP connection reached it: usually a wrong GID index "
           "(set ROCE_PG_IB_GID_INDEX to the RoCE v2 GID of the interface the peers can reach; `show_gids`), "
           "a VLAN/routing problem, or an MTU mismatch along the path.";
  else if (wc.status == IBV_WC_RNR_RETRY_EXC_ERR)
    hint = " The peer had no receive posted for too long (it may be stuck or gone).";
  else if (wc.status == IBV_WC_REM_ACCESS_ERR || wc.status == IBV_WC_LOC_PROT_ERR)
    hint = " A memory registration was rejected (mixed roce_pg versions across ranks?).";
  // The queue pair's own port: with several, the one whose link or path failed.
  const int q = wrQp(wc.wr_id);
  const bool known = q >= 0 && q < static_cast<int>(qps.size());
  const std::string where =
      known ? str(railOf(qps[q]).describe(), " (queue pair ", q, " of ", qps.size(), ")") : describeRails(rails_);
  return str("RDMA transfer with rank ", peer_, " failed: ", ibv_wc_status_str(wc.status), " (status ", wc.status,
             ", vendor error 0x", std::hex, wc.vendor_err, std::dec, ") on ", where, "; remote GID ", remoteGid,
             ", remote QPN ", remoteQpn0, ", path MTU ", mtu, ".", hint);
}

}  // namespace roce::transport::verbs
