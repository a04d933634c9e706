// Progress: completions from the CQs (control messages, landed chunks, sends
// that finished), connections being set up, queued work that may now go;
// idle waits arm the CQs (the process's completion channel wakes the group);
// and what happens when a peer fails.
#include <arpa/inet.h>
#include <cstdint>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "../../common/error.hpp"
#include "verbs_transport.hpp"

namespace roce::transport::verbs {


void VerbsTransport::onCompletion(const ibv_wc& wc) {
  const int p = wrPeer(wc.wr_id);
  if (p < 0 || p >= static_cast<int>(peers_.size()) || !peers_[p]) return;
  Pair& peer = *peers_[p];
  if (!peer.deadReason.empty()) return;  // flushed or late work of a failed peer: nothing refers to it
  if (wc.status != IBV_WC_SUCCESS) {
    // Only wr_id, status, qp_num and vendor_err are valid here.
    return killPeer(p, peer.failureText(wc));
  }
  auto sent = [&](ActiveSend* as) {
    if (as && ++as->done == as->chunks && (as->recvId != 0 || as->matched)) finishSend(p, *as);
  };
  switch (wrKind(wc.wr_id)) {
    case kWrCtrl:
      Pair::retire(peer.qps[wrQp(wc.wr_id)]);
      break;
    case kWrZeroCopy:  // never signaled: nothing to do on success
      break;
    case kWrData: {
      Pair::retire(peer.qps[wrQp(wc.wr_id)]);
      const uint32_t slot = wrIndex(wc.wr_id);
      auto it = stagingOwner_.find(slot);
      ActiveSend* as = it == stagingOwner_.end() ? nullptr : it->second.send;
      giveStaging(slot);
      sent(as);
      break;
    }
    case kWrHeader: {
      Qp& q = peer.qps[wrQp(wc.wr_id)];
      Pair::retire(q);
      ActiveSend* as = q.headerOwner[wrIndex(wc.wr_id)];
      q.headerOwner[wrIndex(wc.wr_id)] = nullptr;
      sent(as);
      break;
    }
    case kWrOneSided:
      Pair::retire(peer.qps[wrQp(wc.wr_id)]);
      oneSidedPieceDone(p, wrIndex(wc.wr_id), nullptr, 0);
      break;
    case kWrOneSidedStaged: {
      Pair::retire(peer.qps[wrQp(wc.wr_id)]);
      const uint32_t slot = wrIndex(wc.wr_id);
      auto it = stagingOwner_.find(slot);
      if (it == stagingOwner_.end()) break;
      StagingPool::Slot staged;
      staged.data = it->second.data;
      oneSidedPieceDone(p, it->second.oneSidedId, &staged, it->second.pieceOffset);
      giveStaging(slot);  // after a read's bytes were copied out of it
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
        std::memcpy(&msg, peer.recvBuffer(q, index), sizeof(msg));
        onCtrl(p, msg);
      }
      if (!peer.deadReason.empty()) break;
      peer.postRecv(q, static_cast<int>(index));
      if (!data) peer.ctrlToReturn++;  // this receive is posted again: the sender may use it
      break;
    }
  }
}

void VerbsTransport::onCtrl(int p, const Ctrl& msg) {
  Pair& peer = *peers_[p];
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
        const Pair::WaitingSend w = it->second.front();
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
      // A peer holds at most ROCE_PG_IB_SLOTS (<= 256) + 2 of our credits.
      if (msg.addr == 0 || peer.remoteHeld.count(msg.id) || peer.remoteHeld.size() > 1024)
        return killPeer(p, str("rank ", p, " granted landing slot ", msg.id,
                               msg.addr == 0 ? " at address 0" : peer.remoteHeld.count(msg.id) ? " twice" : " beyond 1024 credits",
                               " (corrupted control message)"));
      peer.addCredit(msg.id, msg.addr, msg.rkey, kMaxRails);
      break;
    case kNack: {
      auto it = peer.recvs.find(msg.id);
      if (it == peer.recvs.end()) break;
      Request* r = it->second.r;
      regCache_->release(it->second.zc);  // the sender never wrote into it
      peer.recvs.erase(it);
      if (!r) break;  // failed already (a device receive fed copy-mode chunks)
      if (msg.len == r->len)  // the sizes agree: the sender could not send it by RDMA (device memory)
        r->fail(str("rank ", p, " could not send its ", r->len, " bytes to rank ", rank_,
                    " by RDMA (device memory; rank ", p, "'s error says why)"));
      else
        r->fail(str("rank ", rank_, " expected a message of ", r->len, " bytes from rank ", p, " but rank ", p,
                    " sent ", msg.len, " bytes: every rank must pass tensors of the same size and dtype to this operation"));
      break;
    }
    default:
      killPeer(p, str("unknown control message ", msg.type, " from rank ", p, " (mixed roce_pg versions?)"));
  }
}

void VerbsTransport::onData(int p, uint32_t slot, uint32_t byteLen) {
  Pair& peer = *peers_[p];
  // Everything here comes from the peer: the slot from the immediate, the rest
  // from the header it wrote. Any inconsistency fails the peer; nothing is
  // copied and the receive cannot complete with a hole.
  const auto owner = landingOwner_.find(slot);
  if (owner == landingOwner_.end() || owner->second.peer != p)
    return killPeer(p, str("rank ", p, " wrote to landing slot ", slot, ", which is not granted to it (corrupted immediate)"));
  // byte_len of a WRITE_WITH_IMM is what the peer wrote; 0 means the provider does not report it.
  if (byteLen != 0 && (byteLen < sizeof(SlotHeader) || byteLen > stride_))
    return killPeer(p, str("rank ", p, " wrote ", byteLen, " bytes into a landing slot of ", stride_));
  const char* src = landing_->data(slot);
  SlotHeader h;
  std::memcpy(&h, src, sizeof(h));
  if (h.flags & kSlotEager) {
    if (h.flags != kSlotEager || h.recvId != 0 || h.offset != 0 || h.len > slotBytes_ ||
        (byteLen != 0 && h.len != byteLen - sizeof(SlotHeader)))
      return killPeer(p, str("rank ", p, " sent an inconsistent eager message (length ", h.len, ", ", byteLen,
                             " bytes written, flags ", h.flags, "): corrupted slot header"));
    announce(p, h.tag, Arrival{true, h.len, {}}, src + sizeof(h));
    landingConsumed(p, slot);
    return;
  }
  auto it = h.recvId <= UINT32_MAX ? peer.recvs.find(static_cast<uint32_t>(h.recvId)) : peer.recvs.end();
  if (it == peer.recvs.end())
    return killPeer(p, str("rank ", p, " sent a chunk for receive ", h.recvId, ", which rank ", rank_,
                           " has not posted (corrupted slot header)"));
  auto& st = it->second;
  const bool zc = h.flags & kSlotZeroCopy;
  if (!st.r) {
    // A device receive already failed by a copy-mode chunk: the rest of its
    // chunks still come (the sender does not know), and are dropped unread.
    if (++st.got >= st.expected) peer.recvs.erase(it);
    return landingConsumed(p, slot);
  }
  if (st.mode == 0) {  // zero copy was offered: the first chunk says what the sender chose
    st.mode = zc ? 2 : 1;
    const uint64_t step = zc ? st.piece : slotBytes_;
    st.expected = std::max<uint64_t>(1, (st.r->len + step - 1) / step);
    st.seen.assign(st.expected, false);
  }
  if ((st.mode == 2) != zc || (h.flags & ~kSlotZeroCopy))
    return killPeer(p, str("rank ", p, " sent a chunk in ", zc ? "zero-copy" : "copy", " mode for a receive in the other "
                           "mode (flags ", h.flags, "; corrupted slot header or mixed roce_pg versions)"));
  const uint64_t chunk = zc ? st.piece : slotBytes_;
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
  if (!zc && st.r->owner.device) {
    // A peer that staged this call copies into landing slots; the CPU must
    // not write the payload into device memory.
    st.r->fail(deviceRegFailure(*st.r, "receive"));
    regCache_->release(st.zc);
    st.zc = nullptr;
    st.r = nullptr;  // failed: its owner may free it; later chunks are only counted
    if (++st.got >= st.expected) peer.recvs.erase(it);
    return landingConsumed(p, slot);
  }
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
  landingConsumed(p, slot);
}

bool VerbsTransport::pollCompletions() {
  bool moved = false;
  ibv_wc wcs[32];
  for (size_t rail = 0; rail < cqs_.size(); ++rail) {
    if (pollRail(rail, wcs)) moved = true;
  }
  return moved;
}

bool VerbsTransport::pollRail(size_t rail, ibv_wc* wcs) {
  bool moved = false;
  for (;;) {
    const int n = cqs_[rail]->poll(wcs, 32);
    if (n < 0) {
      failAll(str("ibv_poll_cq failed on ", rails_[rail]->describe()));
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
  return moved;
}

bool VerbsTransport::progress() {
  bool moved = pollCompletions();
  // Peers waiting for landing slots: another group may have given some back
  // (the pool wakes this group's wait when it does). Tried once per wake-up
  // of the pool's waiters, lock-free until then; a try that finds none
  // waits again (takeOpen registers this group).
  if (!needy_.empty() && landing_->wakeups() != needyTried_) {
    needyTried_ = landing_->wakeups();
    moved |= serveNeedy();
  }
  for (int p : live_) {
    Pair& peer = *peers_[p];
    if (!peer.deadReason.empty() || peer.phase == Pair::Phase::Unconnected) continue;
    try {
      if (!peer.ready()) {
        moved |= peer.advanceHandshake();
        if (!peer.ready()) continue;
      }
      if (!peer.watchAsked) dropSideChannel(p, peer);
      moved |= peers_[p]->flushCtrl();
      moved |= flushAnnouncements(p);
      moved |= streamSends(p);
      moved |= streamOneSided(p);
    } catch (const std::exception& e) {
      killPeer(p, e.what());
      moved = true;
    }
  }
  return moved;
}

bool VerbsTransport::prepareWait(std::vector<pollfd>& fds, bool anySource) {
  (void)anySource;  // every arrival is a completion, announced like the rest
  // Connections being set up are announced by their sockets.
  for (int p : live_) {
    const Pair& peer = *peers_[p];
    if (peer.deadReason.empty() && peer.sock >= 0 && !peer.ready())
      fds.push_back(pollfd{peer.sock, static_cast<short>(POLLIN | (peer.outbuf.empty() ? 0 : POLLOUT)), 0});
  }
  // Every other event is a completion (the peer's control messages and
  // chunks, and the send completions that free queue slots, on any rail):
  // armed here, it wakes the group's wake-up descriptor, which the waiter
  // polls already (the process's completion channel, read by the runtime
  // thread: verbs_device.hpp). Nothing connected yet: no CQs, only sockets.
  if (!wakeup()) return cqs_.empty();
  for (auto& cqs : cqs_)
    if (!cqs->arm()) return false;
  return true;
}

std::string VerbsTransport::checkPeers() {
  // The devices are the process's (shared by its groups): a device or port
  // error fails every group on it; an error naming a CQ or queue pair only
  // the group (or peer) it belongs to. A rail that goes down fails the
  // group's every peer, not only the queue pairs on it: the protocol spreads
  // each message over all rails, and a clear error beats a silent half
  // speed (docs/ARCHITECTURE.md, "Every NIC").
  std::string e;
  for (size_t rail = 0; rail < rails_.size() && e.empty(); ++rail) {
    e = rails_[rail]->asyncError();
    if (e.empty() && rail < cqs_.size()) e = cqs_[rail]->errorOn(*rails_[rail]);  // no CQs before the first connection
  }
  if (!e.empty()) {
    failAll(e);
    return e;
  }
  for (int p : live_) {
    Pair& peer = *peers_[p];
    if (!peer.deadReason.empty()) continue;
    for (const Qp& q : peer.qps)
      if (std::string qe = q.qp ? railOf(q).qpError(q.qp) : std::string(); !qe.empty()) {
        killPeer(p, str(qe, " (queue pair to rank ", p, ")"));
        break;
      }
  }
  // A peer that left closes its side channel: EOF. What it sent before is in
  // the CQs already (its writes completed before it closed), so take that
  // first, then fail what still waits for it.
  pollCompletions();
  for (int p : live_) {
    Pair& peer = *peers_[p];
    if (!peer.deadReason.empty() || !peer.ready() || peer.sock < 0) continue;  // no socket: the lifeline watches it
    char c;
    const ssize_t n = recv(peer.sock, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      killPeer(p, str("rank ", p, " closed its verbs connection to rank ", rank_, " (", n == 0 ? "EOF" : std::strerror(errno),
                      "): it exited or destroyed the process group"), /*peerEnded=*/true);
  }
  for (int p : live_)
    if (!peers_[p]->deadReason.empty()) return peers_[p]->deadReason;
  return {};
}

void VerbsTransport::failPeer(int p, const std::string& why) {
  // What the peer wrote before it left is in the CQs already: take it first.
  pollCompletions();
  killPeer(p, why);
}

void VerbsTransport::dropSideChannel(int p, Pair& peer) {
  // Once both ends are ready the socket carries nothing more; it was kept
  // only for its EOF (the peer left). The group's lifeline can watch the
  // peer's process instead, over the one link between the two processes:
  // then the socket goes, and a group costs no descriptor per peer.
  // The ready byte must be out first (normally it is).
  if (!peer.outbuf.empty()) {
    peer.advanceHandshake();
    if (!peer.outbuf.empty()) return;  // the socket is full: next round
  }
  peer.watchAsked = true;
  if (!watchPeer(p)) return;
  close(peer.sock);
  peer.sock = -1;
}

void VerbsTransport::killPeer(int p, const std::string& why, bool peerEnded) {
  Pair& peer = peerOf(p);
  if (peer.deadReason.empty()) {
    peer.deadReason = why;
    peer.deadByEnding = peerEnded;
    // Stop the NIC from touching this peer's buffers any further; the flushed
    // work requests complete with errors that onCompletion ignores.
    peer.toError();
    // Its queue pairs are in the error state: the shared pools' slots it held
    // can serve the other peers.
    if (landing_) {
      std::vector<uint32_t> landed;
      for (const auto& [id, l] : landingOwner_)
        if (l.peer == p) landed.push_back(id);
      for (uint32_t id : landed) giveLanding(id);
      std::vector<uint32_t> held;
      for (const auto& [id, use] : stagingOwner_)
        if (use.peer == p) held.push_back(id);
      for (uint32_t id : held) giveStaging(id);
    }
    peer.granted = 0;
    peer.reservedHeld = 0;
  }
  for (auto& [tag, q] : peer.sendsWaiting)
    for (const Pair::WaitingSend& w : q)
      if (!w.eager) w.r->fail(why, peerEnded);  // eager sends are in `active`, failed below
  peer.sendsWaiting.clear();
  peer.announcements.clear();
  peer.arrivals.clear();
  peer.unannounced.clear();
  // The queue pairs are in the error state (above): the NIC no longer reads or
  // writes these buffers, so their registrations may be reused or dropped.
  for (auto& as : peer.active) {
    regCache_->release(as.zc);
    as.r->fail(why, peerEnded);
  }
  peer.active.clear();
  for (auto& [id, st] : peer.recvs) {
    regCache_->release(st.zc);
    if (st.r) st.r->fail(why, peerEnded);  // null: failed already, only its chunks were awaited
  }
  peer.recvs.clear();
  for (auto& op : peer.oneSided) {
    regCache_->release(op.zc);
    op.r->fail(why, peerEnded);
  }
  peer.oneSided.clear();
  peer.ctrlQueue.clear();
  if (landing_) serveNeedy();
}

void VerbsTransport::failAll(const std::string& why) {
  for (int p : live_) killPeer(p, why);
}

}  // namespace roce::transport::verbs
