// Which peer may write which landing slot (docs/ARCHITECTURE.md, "The verbs
// transport", Memory).
//
// A peer holds `granted` slots of the process's landing pool for this group
// (landing_pool.hpp): credits it has not used yet, chunks in flight, chunks
// landed and not yet handled. Slots are granted
//   * at connection: the peer's reserved slot (one per peer is reserved for
//     the group in the process's pool), which goes back to the same peer
//     each time it is consumed, so the peer always has a credit; and one
//     open slot while the pool keeps more than its reserve of open slots
//     free. These two "standing" grants let small messages go eagerly;
//   * when a receive from the peer needs more chunks than the peer holds, up
//     to ROCE_PG_IB_SLOTS at a time: open slots, as many as are free;
// and a consumed open slot goes back to the same peer while it still needs
// one (or to keep its standing two, reserve permitting), else to the pool,
// where peers waiting for slots get it. Demand grants are consumed and come
// back promptly, standing open grants are capped by the reserve, and each
// peer's reserved slot is its own: so a receive that needs slots always
// gets them eventually, at worst one chunk per round trip through the
// reserved slot, whatever idle peers or other groups hold.
#include <algorithm>
#include <cstdint>

#include "verbs_transport.hpp"

namespace roce::transport::verbs {


// Chunks still to arrive from `peer` beyond the slots it holds (at most what
// it may hold more of).
int VerbsTransport::need(const Pair& peer) const {
  uint64_t remaining = 0;
  for (const auto& [id, st] : peer.recvs) {
    if (st.mode != 0) {
      remaining += st.expected - st.got;
    } else {
      // Zero copy offered, the sender's choice unknown: it sends pieces (the
      // fewer), or chunks, which the first chunk reveals (need grows then).
      remaining += std::max<uint64_t>(1, (st.r->len + st.piece - 1) / std::max<uint64_t>(st.piece, 1));
    }
    if (remaining >= static_cast<uint64_t>(cap_)) break;
  }
  const int wanted = static_cast<int>(std::min<uint64_t>(remaining, static_cast<uint64_t>(cap_)));
  return std::max(0, wanted - peer.granted);
}

uint32_t VerbsTransport::standingReserve() const {
  return std::max<uint32_t>(static_cast<uint32_t>(cap_), landing_->openSlots() / 4);
}

bool VerbsTransport::takeLanding(int p, Pair& peer, Grant kind, LandingPool::Slot* slot) {
  const bool reserved = kind == Grant::Reserved;
  // A receive's need that finds no open slot is woken when one comes back.
  if (reserved ? !landing_->takeReserved(landingShare_, slot)
               : !landing_->takeOpen(slot, kind == Grant::Standing ? standingReserve() : 0,
                                     kind == Grant::Demand ? wakeup() : nullptr))
    return false;
  landingOwner_[slot->id] = {p, reserved};
  peer.granted++;
  peer.reservedHeld += reserved;
  return true;
}

void VerbsTransport::sendCredit(int p, const LandingPool::Slot& slot) {
  Ctrl c = makeCtrl(kCredit, slot.id);
  c.addr = slot.addr;
  std::copy(std::begin(slot.rkey), std::end(slot.rkey), std::begin(c.rkey));
  peers_[p]->queueCtrl(c);
}

bool VerbsTransport::grantTo(int p, Pair& peer) {
  LandingPool::Slot slot;
  // Open slots; a peer without its reserved slot (a group of more than
  // LandingPool::kMaxReservedPerGroup peers) gets one when one is left.
  if (!takeLanding(p, peer, Grant::Demand, &slot) &&
      (peer.reservedHeld > 0 || !takeLanding(p, peer, Grant::Reserved, &slot)))
    return false;  // every open slot is held: the peer goes on with its credits meanwhile
  sendCredit(p, slot);
  return true;
}

void VerbsTransport::giveLanding(uint32_t slot) {
  auto it = landingOwner_.find(slot);
  if (it == landingOwner_.end()) return;
  landing_->give(it->second.reserved ? &landingShare_ : nullptr, slot);
  landingOwner_.erase(it);
}

void VerbsTransport::grantNeeded(int p) {
  if (!landing_) return;  // not connected yet: grants go out with the handshake
  Pair& peer = *peers_[p];
  int n = need(peer);
  while (n-- > 0 && grantTo(p, peer)) {
  }
  if (need(peer) > 0) {
    // Other groups (or this one's other peers) hold every open slot.
    if (counters()) Counters::add(counters()->landingWaits, 1);
    if (std::find(needy_.begin(), needy_.end(), p) == needy_.end()) needy_.push_back(p);
  }
}

void VerbsTransport::landingConsumed(int p, uint32_t slot) {
  Pair& peer = *peers_[p];
  const bool reserved = landingOwner_.at(slot).reserved;  // onData checked the owner
  peer.granted--;
  peer.reservedHeld -= reserved;
  if (peer.deadReason.empty() &&
      (reserved || need(peer) > 0 ||
       (peer.granted < kStandingGrants && landing_->openFree() >= standingReserve()))) {
    // Straight back to the peer that wrote it: always its reserved slot.
    peer.granted++;
    peer.reservedHeld += reserved;
    sendCredit(p, landing_->slot(slot));
    return;
  }
  giveLanding(slot);
  serveNeedy();
}

bool VerbsTransport::serveNeedy() {
  bool granted = false;
  for (size_t i = 0; i < needy_.size();) {
    const int p = needy_[i];
    Pair& peer = *peers_[p];
    int n = peer.deadReason.empty() ? need(peer) : 0;
    while (n-- > 0 && grantTo(p, peer)) granted = true;
    if (peer.deadReason.empty() && need(peer) > 0) {
      ++i;
    } else {
      needy_.erase(needy_.begin() + static_cast<long>(i));
    }
  }
  return granted;
}

}  // namespace roce::transport::verbs
