// Posting and matching: sends and receives become control messages (RTS,
// RTR), announcements and chunks (the protocol: docs/ARCHITECTURE.md, "The
// verbs transport").
#include "verbs_transport.hpp"

#include <arpa/inet.h>
#include <cstdint>

#include <algorithm>
#include <cstring>

#include "../../common/error.hpp"

namespace roce::transport::verbs {


// An eager send that cannot go eagerly (no landing credit) becomes a
// rendezvous send: its announcement turns into an RTS (same place in the
// order), and its data streams to its receive once the RTR is in (now, if it
// came already).
void VerbsTransport::toRendezvous(int p, ActiveSend& as) {
  Pair& peer = *peers_[p];
  Request* r = as.r;
  const bool matched = as.matched;
  const Ctrl rtr = as.rtr;
  for (auto& a : peer.announcements)
    if (a.eager == &as) a.eager = nullptr;  // an RTS now (a.rts was filled in at postSend)
  if (auto w = peer.sendsWaiting.find(r->tag); w != peer.sendsWaiting.end())
    for (auto& waiting : w->second)
      if (waiting.eager == &as) waiting.eager = nullptr;
  for (auto it = peer.active.begin(); it != peer.active.end(); ++it)
    if (&*it == &as) { peer.active.erase(it); break; }
  if (matched) matchSend(p, r, rtr);
}

// Posts the queued announcements in order: an RTS takes a control credit, an
// eager message a landing credit and a staging slot (it goes as a rendezvous
// when the peer granted no slot). The first that cannot go holds back the
// rest (order matters); flushCtrl's messages do not wait for them.
bool VerbsTransport::flushAnnouncements(int p) {
  Pair& peer = *peers_[p];
  if (!peer.ready()) return false;
  Qp& q = peer.qps[0];
  bool moved = false;
  while (!peer.announcements.empty() && q.posted < sqDepth_) {
    Pair::Announcement& a = peer.announcements.front();
    if (a.eager && peer.remoteFree.empty()) toRendezvous(p, *a.eager);
    if (!a.eager) {
      if (peer.ctrlCredits <= kCtrlReserve) break;
      peer.postCtrl(a.rts);
    } else {
      const Request& r = *a.eager->r;
      SlotHeader h{0, 0, r.len, kSlotEager, r.tag, {}};
      if (!postChunk(p, q, *a.eager, h, static_cast<const char*>(r.buf))) break;  // no staging slot: later
      if (counters()) Counters::add(counters()->eagerSends, 1);
    }
    peer.announcements.pop_front();
    moved = true;
  }
  return moved;
}

void VerbsTransport::postSend(Request* r) {
  Pair& peer = peerOf(r->peer);
  if (!peer.deadReason.empty()) return r->fail(peer.deadReason, peer.deadByEnding);
  ActiveSend* eager = nullptr;
  if (r->len <= eagerLimit() && !r->owner.device) {
    peer.active.push_back(ActiveSend{r, 0, 1});
    eager = &peer.active.back();
  }
  auto it = peer.rtrsWaiting.find(r->tag);
  const bool rtrIn = it != peer.rtrsWaiting.end() && !it->second.empty();
  peer.announcements.push_back({makeCtrl(kRts, 0, r->tag, r->len), eager});
  if (rtrIn) {
    const Ctrl rtr = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) peer.rtrsWaiting.erase(it);
    if (eager) matchEager(r->peer, *eager, rtr);
    else matchSend(r->peer, r, rtr);
  } else {
    peer.sendsWaiting[r->tag].push_back({r, eager});
  }
  flushAnnouncements(r->peer);
}

// The RTR of the receive an eager send fills: only the sizes are compared
// (the data goes to a landing slot regardless, so that the receiver pairs its
// receives in order and reports the mismatch too). If the data has not gone
// and no landing credit is left, it goes as a rendezvous to this receive.
void VerbsTransport::matchEager(int p, ActiveSend& as, const Ctrl& rtr) {
  as.matched = true;
  as.rtr = rtr;
  if (as.posted == 0 && peers_[p]->remoteFree.empty()) return toRendezvous(p, as);
  if (rtr.len != as.r->len)
    as.mismatch = str("rank ", rank_, " sent ", as.r->len, " bytes to rank ", p, " but rank ", p, " expected ",
                      rtr.len, " bytes: every rank must pass tensors of the same size and dtype to this operation");
  if (as.done == as.chunks) finishSend(p, as);
}

// A send whose chunks are all written (and, if eager, whose RTR arrived).
void VerbsTransport::finishSend(int p, ActiveSend& as) {
  Pair& peer = *peers_[p];
  regCache_->release(as.zc);
  if (as.mismatch.empty()) as.r->done = true;
  else as.r->fail(as.mismatch);
  for (auto it = peer.active.begin(); it != peer.active.end(); ++it)
    if (&*it == &as) { peer.active.erase(it); break; }
}

void VerbsTransport::postRecv(Request* r) {
  Pair& peer = peerOf(r->peer);
  if (!peer.deadReason.empty()) return r->fail(peer.deadReason, peer.deadByEnding);
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
    Ctrl rtr = makeCtrl(kRtr, id, r->tag, r->len);
    for (size_t rail = 0; rail < rails_.size(); ++rail) rtr.rkey[rail] = zc->rkey(static_cast<int>(rail));
    rtr.addr = reinterpret_cast<uint64_t>(r->buf);
    rtr.piece = piece;
    peers_[r->peer]->queueCtrl(rtr);
  } else {
    // A device buffer that could not be registered still posts its RTR, in
    // order: the sender pairs RTRs with sends strictly in order per tag, so a
    // receive that skipped it would hang its sender and hand the next
    // receive on the tag this message. Whatever arrives for it fails it
    // (deliverEager, onData): the CPU must not write device memory.
    const uint64_t chunks = std::max<uint64_t>(1, (r->len + slotBytes_ - 1) / slotBytes_);
    peer.recvs[id] = {r, chunks, 0, std::vector<bool>(chunks, false), nullptr, 0, 1};
    peers_[r->peer]->queueCtrl(makeCtrl(kRtr, id, r->tag, r->len));
  }
  grantNeeded(r->peer);
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
  Pair& peer = *peers_[p];
  auto it = peer.recvs.find(id);
  if (it == peer.recvs.end()) return;  // failed already (NACK): nothing to fill
  Request* r = it->second.r;
  regCache_->release(it->second.zc);
  peer.recvs.erase(it);
  if (len != r->len)
    return r->fail(str("rank ", rank_, " expected a message of ", r->len, " bytes from rank ", p, " but rank ", p,
                       " sent ", len, " bytes: every rank must pass tensors of the same size and dtype to this operation"));
  if (r->owner.device) return r->fail(deviceRegFailure(*r, "receive"));  // the CPU must not write it
  if (len) std::memcpy(r->buf, data, len);
  countCopied(len);
  r->done = true;
}

RegCache::Entry* VerbsTransport::registerUserBuffer(const Request& r) {
  if (r.owner.device) {  // zero copy at every size: the CPU must not touch it
    deviceRegCache_->setCounters(counters());
    // Registrations of tensors the user dropped (their memory went back to
    // the allocator then) go now, not when room runs out: a freed segment
    // stays pinned by its dma-buf until then.
    deviceRegCache_->dropReleased();
    return deviceRegCache_->acquire(r.owner, r.buf, r.len);
  }
  if (zeroCopyMin_ == 0 || r.len < zeroCopyMin_ || !r.owner) return nullptr;
  regCache_->setCounters(counters());
  return regCache_->acquire(r.owner, r.buf, r.len);
}

// Why a device buffer could not go by RDMA, and what to do about it. Only
// reachable when the ranks disagree (one staged the call, e.g. a different
// ROCE_PG_IB_DEVICE_REG_BYTES) or the provider refused the registration.
std::string VerbsTransport::deviceRegFailure(const Request& r, const char* what) const {
  return str("rank ", rank_, ": the ", what, " of ", r.len, " bytes of device memory with rank ", r.peer,
             " cannot go by RDMA (", what == std::string("send") ? "rank " + std::to_string(r.peer) +
             " offered no registered buffer, or " : "", "registering it on ", describeRails(rails_),
             " failed or exceeds ROCE_PG_IB_DEVICE_REG_BYTES=", deviceRegCache_->limit(),
             "); the CPU must not touch device memory, so it fails. Set ROCE_PG_GPUDIRECT=off on every rank "
             "to stage device tensors through host memory, and the same ROCE_PG_IB_DEVICE_REG_BYTES everywhere");
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
  Pair& peer = *peers_[p];
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
  Pair& peer = *peers_[p];
  const uint32_t recvId = rtr.id;
  const uint64_t len = rtr.len;
  if (len != r->len) {
    r->fail(str("rank ", rank_, " sent ", r->len, " bytes to rank ", p, " but rank ", p, " expected ", len,
                " bytes: every rank must pass tensors of the same size and dtype to this operation"));
    peers_[p]->queueCtrl(makeCtrl(kNack, recvId, r->tag, r->len));
    return;
  }
  ActiveSend as{r, recvId, 0};
  // Zero copy when the receiver offered it and our buffer registers too.
  if (rtr.addr != 0 && rtr.piece >= 4096 && rtr.piece <= maxMsg_ && rtr.piece <= (uint64_t(1) << 30))
    as.zc = registerUserBuffer(*r);
  if (!as.zc && r->owner.device) {
    r->fail(deviceRegFailure(*r, "send"));
    peers_[p]->queueCtrl(makeCtrl(kNack, recvId, r->tag, r->len));
    return;
  }
  if (as.zc) {
    as.piece = rtr.piece;
    as.chunks = (r->len + as.piece - 1) / as.piece;
    as.remoteAddr = rtr.addr;
    std::copy(std::begin(rtr.rkey), std::end(rtr.rkey), as.rkeys.begin());
  } else {
    as.chunks = std::max<uint64_t>(1, (r->len + slotBytes_ - 1) / slotBytes_);
  }
  peer.active.push_back(as);
}

bool VerbsTransport::streamSends(int p) {
  Pair& peer = *peers_[p];
  if (!peer.ready()) return false;
  bool moved = false;
  for (auto& as : peer.active) {
    if (as.recvId == 0) continue;  // eager: posted by flushAnnouncements
    // A channel's messages keep to its own queue pair (one ECMP path per
    // ring); others are spread chunk by chunk.
    const bool pinned = as.r->lane > 0;
    while (as.posted < as.chunks && !peer.remoteFree.empty()) {
      Qp& q = peer.qps[(pinned ? as.r->lane - 1u : peer.nextQp) % peer.qps.size()];
      if (q.posted + (as.zc ? 2 : 1) > sqDepth_) {
        if (pinned) break;  // the other channels' queue pairs may have room
        return moved;
      }
      const uint64_t step = as.zc ? as.piece : slotBytes_;
      const uint64_t offset = as.posted * step;
      const uint64_t len = std::min<uint64_t>(step, as.r->len - std::min(as.r->len, offset));
      SlotHeader h{as.recvId, offset, len, as.zc ? kSlotZeroCopy : 0, 0, {}};
      // No staging slot (the process's pool is shared): this message waits;
      // a later zero-copy one needs none and may go.
      if (!postChunk(p, q, as, h, static_cast<const char*>(as.r->buf) + offset)) break;
      if (!pinned) peer.nextQp++;
      moved = true;
    }
  }
  return moved;
}

// Writes one chunk into a landing slot the peer granted (the caller checked
// that there is one, room on q, and a staging slot unless the chunk needs
// none). Where the header (and a copied payload) comes from:
//   * zero copy: the payload goes by RDMA_WRITE straight from the registered
//     tensor, then the 64-byte header alone, from this queue pair's send ring;
//   * a copied chunk small enough to go inline: from the stack (the provider
//     copies inline data into the work request during ibv_post_send);
//   * any other copied chunk: header + payload from a staging slot.
// All end with an RDMA_WRITE_WITH_IMM into the landing slot (immediate = slot).
bool VerbsTransport::postChunk(int p, Qp& q, ActiveSend& as, const SlotHeader& h, const char* payload) {
  Pair& peer = *peers_[p];
  const int qIndex = static_cast<int>(&q - peer.qps.data());
  const Pair::RemoteSlot land = peer.remoteFree.front();
  const size_t headBytes = sizeof(h) + (as.zc ? 0 : h.len);
  const bool inlined = headBytes <= q.maxInline;
  ibv_send_wr wrs[2]{};
  ibv_sge sges[2]{};
  ibv_send_wr& head = as.zc ? wrs[1] : wrs[0];
  char stack[kInlineWant];
  char* buf = stack;
  uint32_t lkey = 0;  // unused for inline data
  if (as.zc || inlined) {
    // No staging slot; the ring entry names the send when the write completes.
    const uint32_t entry = peer.takeRingEntry(q);
    q.headerOwner[entry] = &as;
    head.wr_id = wrId(kWrHeader, p, qIndex, entry);
    if (as.zc) {
      buf = peer.sendRingEntry(qIndex, entry);
      lkey = peer.ctrlMrs.lkey(q.rail);
    }
  } else {
    // Another group may have taken the last one: the process shares the pool.
    StagingPool::Slot slot;
    if (!staging_->tryTake(&slot, wakeup())) {
      if (counters()) Counters::add(counters()->stagingWaits, 1);
      return false;
    }
    stagingOwner_[slot.id] = {p, &as};
    buf = slot.data;
    lkey = slot.lkey[q.rail];
    head.wr_id = wrId(kWrData, p, qIndex, slot.id);
  }
  std::memcpy(buf, &h, sizeof(h));
  if (as.zc) {
    // The payload, tensor to tensor, unsignaled: the header's completion
    // (same queue pair, posted after it) covers it.
    sges[0] = ibv_sge{reinterpret_cast<uint64_t>(payload), static_cast<uint32_t>(h.len), as.zc->lkey(q.rail)};
    wrs[0].wr_id = wrId(kWrZeroCopy, p, qIndex, 0);
    wrs[0].sg_list = &sges[0];
    wrs[0].num_sge = 1;
    wrs[0].opcode = IBV_WR_RDMA_WRITE;
    wrs[0].wr.rdma.remote_addr = as.remoteAddr + h.offset;
    wrs[0].wr.rdma.rkey = as.rkeys[q.remoteRail];  // the receiver's key on the port this queue pair reaches
    wrs[0].next = &wrs[1];
    if (counters()) Counters::add(counters()->bytesZeroCopy, h.len);
  } else {
    if (h.len) std::memcpy(buf + sizeof(h), payload, h.len);
    countCopied(h.len);
  }
  ibv_sge& headSge = as.zc ? sges[1] : sges[0];
  headSge = ibv_sge{reinterpret_cast<uint64_t>(buf), static_cast<uint32_t>(headBytes), lkey};
  head.sg_list = &headSge;
  head.num_sge = 1;
  head.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  head.send_flags = IBV_SEND_SIGNALED | (inlined ? IBV_SEND_INLINE : 0);  // completion frees / retires
  head.imm_data = htonl(land.id);
  head.wr.rdma.remote_addr = land.addr;  // header + payload fit: the handshake checked that both sides use one stride
  head.wr.rdma.rkey = land.rkey[q.remoteRail];
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(q.qp, &wrs[0], &bad);
  if (rc != 0) {
    if (wrKind(head.wr_id) == kWrData) giveStaging(wrIndex(head.wr_id));  // the process's: not left behind
    throwComm(str("ibv_post_send (RDMA write) to rank ", p, " failed (", rc, ") on ", railOf(q).describe()));
  }
  const int n = as.zc ? 2 : 1;
  q.posted += n;
  q.covers.push_back(q.unsignaled + n);
  q.unsignaled = 0;
  peer.remoteFree.pop_front();
  peer.remoteHeld.erase(land.id);
  as.posted++;
  return true;
}

void VerbsTransport::giveStaging(uint32_t id) {
  if (stagingOwner_.erase(id)) staging_->give(id);
}

}  // namespace roce::transport::verbs
