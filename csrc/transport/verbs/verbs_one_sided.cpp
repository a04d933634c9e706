// One-sided access (windows, docs/ARCHITECTURE.md "One-sided windows"):
// memory a rank exposes to its peers, registered on every rail for remote
// writes and reads, and Request::Kind::Write / Read as RDMA WRITEs into, or
// RDMA READs out of, a peer's exposed memory. The target's CPU takes no
// part: no receive, no control message, no landing slot. Each piece is
// signaled: a write is done only once the peer's NIC acknowledged every
// byte, so whatever the writer sends the peer after that (a window's
// signal) arrives after the bytes are in its memory; a read once its bytes
// are in the request's buffer.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../../common/error.hpp"
#include "verbs_transport.hpp"

namespace roce::transport::verbs {

namespace {

class VerbsExposure : public ExposedMemory {
 public:
  VerbsExposure(Rails rails, void* base, size_t len) : rails_(std::move(rails)), base_(base), len_(len) {
    mr_.registerOn(rails_, base, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                   "window");
  }
  RemoteMemory describe() const override {
    WindowKey k;
    k.magic = kWindowKeyMagic;
    k.rails = static_cast<uint32_t>(rails_.size());
    k.addr = reinterpret_cast<uint64_t>(base_);
    k.len = len_;
    for (size_t r = 0; r < rails_.size(); ++r) k.rkey[r] = mr_.rkey(static_cast<int>(r));
    RemoteMemory m;
    std::memcpy(m.bytes, &k, sizeof(k));
    return m;
  }

 private:
  Rails rails_;  // declared first: the devices (protection domains) outlive the registration
  void* base_;
  size_t len_;
  MemoryRegion mr_;
};

}  // namespace

std::unique_ptr<ExposedMemory> VerbsTransport::expose(void* base, size_t len, std::string* why) {
  if (len == 0) return *why = "nothing to expose (0 bytes)", nullptr;
  try {
    return std::make_unique<VerbsExposure>(rails_, base, len);
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
}

void VerbsTransport::postOneSided(Request* r) {
  Pair& peer = peerOf(r->peer);
  if (!peer.deadReason.empty()) return r->fail(peer.deadReason, peer.deadByEnding);
  const char* verb = r->kind == Request::Kind::Read ? "read" : "write";
  WindowKey k;
  std::memcpy(&k, r->remote->bytes, sizeof(k));
  if (k.magic != kWindowKeyMagic || k.rails == 0 || k.rails > kMaxRails || r->remoteOffset > k.len ||
      r->len > k.len - r->remoteOffset)
    return r->fail(str("rank ", rank_, ": a one-sided ", verb, " of ", r->len, " bytes at byte ", r->remoteOffset,
                       " does not fit what rank ", r->peer, " exposed (", k.magic == kWindowKeyMagic ? k.len : 0,
                       " bytes; a corrupted window key?)"));
  if (r->len == 0) return void(r->done = true);
  ActiveOneSided op{r, 0};
  do {
    op.id = peer.nextOneSidedId++ & 0xffffff;
  } while (op.id == 0 || std::any_of(peer.oneSided.begin(), peer.oneSided.end(),
                                     [&](const ActiveOneSided& o) { return o.id == op.id; }));
  // Straight from or into the request's buffer when it registers (large
  // enough and owned); otherwise through staging slots, or, a small write,
  // inline in the work request.
  op.zc = registerUserBuffer(*r);
  op.remoteAddr = k.addr + r->remoteOffset;
  std::copy(std::begin(k.rkey), std::end(k.rkey), op.rkeys.begin());
  op.remoteRails = k.rails;
  op.step = op.zc ? zeroCopyPiece(r->len, qpsPerPeer_) : slotBytes_;
  op.chunks = (r->len + op.step - 1) / op.step;
  peer.oneSided.push_back(op);
  streamOneSided(r->peer);
}

bool VerbsTransport::streamOneSided(int p) {
  Pair& peer = *peers_[p];
  if (!peer.ready()) return false;
  // One-sided pieces are bounded by nothing else: leave every queue pair the
  // room its two-sided chunks and control messages are sized for.
  const int room = std::max(1, sqDepth_ - (2 * cap_ + 8));
  bool moved = false;
  for (auto it = peer.oneSided.begin(); it != peer.oneSided.end();) {
    ActiveOneSided& op = *it;
    if (op.posted == 0) {
      // The key names the owner's rails; every queue pair reaches one of them.
      const auto beyond = std::find_if(peer.qps.begin(), peer.qps.end(), [&](const Qp& q) {
        return static_cast<uint32_t>(q.remoteRail) >= op.remoteRails;
      });
      if (beyond != peer.qps.end()) {
        regCache_->release(op.zc);
        op.r->fail(str("rank ", rank_, ": rank ", p, "'s window key names ", op.remoteRails,
                       " rails, but a queue pair to it reaches its rail ", beyond->remoteRail,
                       " (a corrupted key, or ranks of different roce versions)"));
        it = peer.oneSided.erase(it);
        continue;
      }
    }
    while (op.posted < op.chunks) {
      Qp& q = peer.qps[peer.nextQp % peer.qps.size()];
      if (q.posted + 1 > room || !postOneSidedPiece(p, q, op)) return moved;
      peer.nextQp++;
      moved = true;
    }
    ++it;
  }
  return moved;
}

bool VerbsTransport::postOneSidedPiece(int p, Qp& q, ActiveOneSided& op) {
  Pair& peer = *peers_[p];
  const int qIndex = static_cast<int>(&q - peer.qps.data());
  const bool read = op.r->kind == Request::Kind::Read;
  const uint64_t offset = op.posted * op.step;
  const uint64_t len = std::min<uint64_t>(op.step, op.r->len - offset);
  char* local = static_cast<char*>(op.r->buf) + offset;
  ibv_sge sge{};
  ibv_send_wr wr{};
  wr.send_flags = IBV_SEND_SIGNALED;
  if (op.zc) {
    sge = ibv_sge{reinterpret_cast<uint64_t>(local), static_cast<uint32_t>(len), op.zc->lkey(q.rail)};
    wr.wr_id = wrId(kWrOneSided, p, qIndex, op.id);
    if (counters()) Counters::add(counters()->bytesZeroCopy, len);
  } else if (!read && len <= q.maxInline) {
    // The provider copies inline data into the work request while posting.
    sge = ibv_sge{reinterpret_cast<uint64_t>(local), static_cast<uint32_t>(len), 0};
    wr.wr_id = wrId(kWrOneSided, p, qIndex, op.id);
    wr.send_flags |= IBV_SEND_INLINE;
  } else {
    // Another group may have taken the last one: the process shares the pool.
    StagingPool::Slot slot;
    if (!staging_->tryTake(&slot, wakeup())) {
      if (counters()) Counters::add(counters()->stagingWaits, 1);
      return false;
    }
    stagingOwner_[slot.id] = {p, nullptr, op.id, offset, slot.data};
    if (!read) {
      std::memcpy(slot.data, local, len);
      countCopied(len);
    }
    sge = ibv_sge{reinterpret_cast<uint64_t>(slot.data), static_cast<uint32_t>(len), slot.lkey[q.rail]};
    wr.wr_id = wrId(kWrOneSidedStaged, p, qIndex, slot.id);
  }
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = op.remoteAddr + offset;
  wr.wr.rdma.rkey = op.rkeys[q.remoteRail];  // the owner's key on the port this queue pair reaches
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(q.qp, &wr, &bad); rc != 0) {
    if (wrKind(wr.wr_id) == kWrOneSidedStaged) giveStaging(wrIndex(wr.wr_id));
    throwComm(str("ibv_post_send (one-sided RDMA ", read ? "read" : "write", ") to rank ", p, " failed (", rc,
                  ") on ", railOf(q).describe()));
  }
  q.posted++;
  q.covers.push_back(q.unsignaled + 1);
  q.unsignaled = 0;
  op.posted++;
  return true;
}

void VerbsTransport::oneSidedPieceDone(int p, uint32_t id, const StagingPool::Slot* staged, uint64_t pieceOffset) {
  Pair& peer = *peers_[p];
  for (auto it = peer.oneSided.begin(); it != peer.oneSided.end(); ++it) {
    if (it->id != id) continue;
    if (staged && it->r->kind == Request::Kind::Read) {
      const uint64_t len = std::min<uint64_t>(it->step, it->r->len - pieceOffset);
      std::memcpy(static_cast<char*>(it->r->buf) + pieceOffset, staged->data, len);
      countCopied(len);
    }
    if (++it->done == it->chunks) {
      regCache_->release(it->zc);
      it->r->done = true;
      peer.oneSided.erase(it);
    }
    return;
  }
}

}  // namespace roce::transport::verbs
