// Which peer may write which landing slot (see verbs_transport.hpp, Memory).
//
// A peer holds `granted` slots of this rank's landing pool: credits it has
// not used yet, chunks in flight, chunks landed and not yet handled. Slots
// are granted
//   * at connection: two "standing" slots, for eager messages, while the
//     pool keeps more than its reserve free;
//   * when a receive from the peer needs more chunks than the peer holds, up
//     to ROCE_PG_IB_SLOTS at a time, from anywhere in the pool;
// and a consumed slot goes back to the same peer while it still needs one
// (or to keep its standing two, reserve permitting), else to the pool, where
// peers waiting for slots get it. Demand grants are consumed and come back
// promptly; standing grants are capped by the reserve; so a receive that
// needs slots always gets them eventually, whatever idle peers hold.
#include <algorithm>

#include "verbs_transport.hpp"

namespace roce {

using namespace verbs;

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

void VerbsTransport::grantTo(int p, Pair& peer) {
  const uint32_t slot = landing_->take();
  landingOwner_[slot] = p;
  peer.granted++;
  peers_[p]->queueCtrl(makeCtrl(kCredit, slot));
}

void VerbsTransport::grantNeeded(int p) {
  if (!landing_) return;  // not connected yet: grants go out with the handshake
  Pair& peer = *peers_[p];
  int n = need(peer);
  while (n-- > 0 && landing_->available() > 0) grantTo(p, peer);
  if (need(peer) > 0 && std::find(needy_.begin(), needy_.end(), p) == needy_.end()) needy_.push_back(p);
}

void VerbsTransport::landingConsumed(int p, uint32_t slot) {
  Pair& peer = *peers_[p];
  landingOwner_[slot] = -1;
  peer.granted--;
  const size_t reserve = std::max<size_t>(cap_, landing_->count() / 4);
  if (peer.deadReason.empty() &&
      (need(peer) > 0 || (peer.granted < kStandingGrants && landing_->available() >= reserve))) {
    // Straight back to the peer that wrote it.
    landingOwner_[slot] = p;
    peer.granted++;
    peers_[p]->queueCtrl(makeCtrl(kCredit, slot));
    return;
  }
  landing_->give(slot);
  serveNeedy();
}

void VerbsTransport::serveNeedy() {
  for (size_t i = 0; i < needy_.size() && landing_->available() > 0;) {
    const int p = needy_[i];
    Pair& peer = *peers_[p];
    int n = peer.deadReason.empty() ? need(peer) : 0;
    while (n-- > 0 && landing_->available() > 0) grantTo(p, peer);
    if (peer.deadReason.empty() && need(peer) > 0) {
      ++i;
    } else {
      needy_.erase(needy_.begin() + static_cast<long>(i));
    }
  }
}

}  // namespace roce
