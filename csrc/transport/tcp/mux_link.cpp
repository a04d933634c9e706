#include "mux_link.hpp"

#include <cstdint>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <set>

#include "../../common/config.hpp"
#include "../../common/error.hpp"
#include "../../common/log.hpp"
#include "../../common/wakeup.hpp"
#include "../transport.hpp"
#include "mux_chunk.hpp"
#include "tcp_mux.hpp"

namespace roce::transport::tcp {
namespace {

// Why a link's process is gone, after "the process of rank N (...)".
constexpr const char* kEofText =
    "closed its TCP connection: it died (crash, OOM killer, SIGKILL: see its log) or exited without destroying "
    "its process groups";
// Chunks written per sendmsg().
constexpr int kChunksPerCall = 8;
// What one read() moves into other groups' inboxes before it returns to its
// caller (which polls again at once if there is more).
constexpr size_t kReadBudget = 8 << 20;
// The runtime thread reads a link no group has read for this long, at most
// this much per round, and stops while this much waits for groups not
// created here yet (tcp_mux.hpp: idle reading).
constexpr auto kIdleReadAfter = std::chrono::milliseconds(20);
constexpr size_t kRuntimeReadPerRound = 4 << 20;
constexpr size_t kParkedCap = 64 << 20;
// Beyond these (NetworkBudgets::parkedStreamBytes, and this many streams) a
// peer's streams for groups not created here end its link: each holds at
// most a stream's window (mux_chunk.hpp), and only a peer that creates very
// many groups long before this process does, or one that does not follow
// the protocol, gets there.
constexpr size_t kMaxParkedStreams = 4096;
// As the front desk's: a group that never comes here loses its parked bytes.
constexpr auto kParkLimit = std::chrono::minutes(30);

enum End : uint8_t { kOpen = 0, kClosed = 1, kGroupGone = 2, kDropped = 3 };

bool wouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

}  // namespace

struct MuxLink::Socket {
  int fd = -1;
  std::string addr;
  ChunkHeader hdr{};
  size_t hdrGot = 0;
  bool inChunk = false;  // reading a data chunk's payload
  size_t remaining = 0;
  InboxKey key{};        // where it goes
  bool discard = false;  // nobody here wants it
  // The chunk `h` (headed for `to`) is read and dropped.
  void dropChunk(const InboxKey& to, const ChunkHeader& h) {
    key = to;
    discard = true;
    remaining = h.len;
    inChunk = h.flags == kData && h.len > 0;
  }
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

MuxLink::MuxLink(TcpMux& mux) : mux_(mux) {}
MuxLink::~MuxLink() = default;

void MuxLink::addSocket(int fd, std::string addr) {
  std::lock_guard<std::mutex> g(mu_);
  auto s = std::make_unique<Socket>();
  s->fd = fd;
  s->addr = std::move(addr);
  sockets_.push_back(std::move(s));
  wakeOwners();  // groups sleeping on the other sockets must poll this one too
}

bool MuxLink::alive() {
  std::lock_guard<std::mutex> g(mu_);
  return deadReason_.empty();
}

size_t MuxLink::sockets() {
  std::lock_guard<std::mutex> g(mu_);
  return sockets_.size();
}

std::string MuxLink::address() {
  std::lock_guard<std::mutex> g(mu_);
  return sockets_.empty() ? std::string("?") : sockets_.front()->addr;
}

size_t MuxLink::parked() {
  std::lock_guard<std::mutex> g(mu_);
  return parkedStreams();
}

int MuxLink::sendFd() {
  std::lock_guard<std::mutex> g(mu_);
  return sockets_.empty() ? -1 : sockets_.front()->fd;
}

void MuxLink::open(const Stream& s, Wakeup* wake) {
  std::lock_guard<std::mutex> g(mu_);
  MuxInbox& box = inboxes_[{s.selfNonce, s.peerRank}];
  box.owned = true;
  box.wake = wake;
  box.peerNonce = s.peerNonce;
  if (deadReason_.empty()) sendControl(s.peerNonce, s.selfNonce, s.selfRank, kOpenStream);
}

void MuxLink::dropGroup(uint64_t nonce, int rank) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = inboxes_.lower_bound({nonce, INT32_MIN}); it != inboxes_.end() && it->first.first == nonce;) {
    // A stream that arrived, but the group never attached a pipe for it:
    // its sender hears the group is gone, as from a pipe's close().
    if (deadReason_.empty() && it->second.peerNonce && it->second.end == kOpen)
      sendControl(it->second.peerNonce, nonce, rank, kClose);
    it = inboxes_.erase(it);
  }
}

std::vector<int> MuxLink::claimParked(uint64_t nonce, Wakeup* wake) {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<int> peers;
  for (auto it = inboxes_.lower_bound({nonce, INT32_MIN}); it != inboxes_.end() && it->first.first == nonce; ++it)
    if (!it->second.owned) {
      it->second.owned = true;
      it->second.wake = wake;
      peers.push_back(it->first.second);
    }
  return peers;
}

void MuxLink::close(const Stream& s) {
  std::lock_guard<std::mutex> g(mu_);
  inboxes_.erase({s.selfNonce, s.peerRank});
  if (deadReason_.empty()) sendControl(s.peerNonce, s.selfNonce, s.selfRank, kClose);
}

void MuxLink::abandon(const Stream& s) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = inboxes_.find({s.selfNonce, s.peerRank});
  if (it == inboxes_.end()) return;
  MuxInbox& box = it->second;
  // What it held, and what arrives from now on, is dropped but credited:
  // the sender goes on to its end of the stream (or its own failure) rather
  // than waiting for credit until its timeout.
  const size_t dropped = box.buffered();
  box.discard = true;
  box.abandonedBy = s.selfRank;
  box.data = {};
  box.head = 0;
  credit(s.peerNonce, s.selfNonce, s.selfRank, box, dropped, 1);
}

void MuxLink::throwEnded(const Stream& s, uint8_t end) {
  if (end == kClosed)
    throw PeerEndedError(ErrorKind::Comm, str("roce: rank ", s.peerRank, " (", s.peerText, ") destroyed the process "
                                              "group (or aborted it): its process lives, and its end of this group's "
                                              "TCP stream closed"));
  if (end == kGroupGone)
    throw PeerEndedError(ErrorKind::Comm, str("roce: rank ", s.peerRank, " (", s.peerText, ") has no such process "
                                              "group any more: it destroyed the process group (or aborted it) before "
                                              "rank ", s.selfRank, "'s data reached it"));
  if (end == kDropped)
    throwComm(str("rank ", s.peerRank, " (", s.peerText, ") sent on this group 30 minutes or more before rank ",
                  s.selfRank, " created it; that stream was dropped (create every group on every member "
                  "within 30 minutes of each other)"));
  throwComm(str("the process of rank ", s.peerRank, " (", s.peerText, ") ", deadReason_));
}

void MuxLink::die(const std::string& why) {
  if (!deadReason_.empty()) return;
  deadReason_ = why;
  tail_.clear();
  tailHead_ = 0;
  wakeOwners();  // every group with a stream here learns it when it reads next
}

void MuxLink::refuse(const std::string& why) {
  if (!deadReason_.empty()) return;
  refused_ = true;
  mux_.countRefusal();
  die(why);
  // The peer must see its end too, or it would go on sending on a socket
  // nobody reads (the descriptors close only with the last group using them).
  for (auto& so : sockets_) ::shutdown(so->fd, SHUT_RDWR);
}

void MuxLink::sendFailed(const Stream& s) {
  dieOnError("send");
  throwStreamEnd(s);
}

void MuxLink::drainDead() {
  if (refused_) return;  // it broke the protocol: nothing more of it is believed
  // What the peer sent before its socket went is still readable: a peer
  // that destroyed the group closed its streams first, and that (it ended on
  // purpose, often the echo of a failure elsewhere) is what to report, not
  // the broken connection its exit left. The link is dead already, so
  // nothing read here is answered.
  for (auto& so : sockets_) {
    size_t budget = kStreamWindow * 4;
    pump(*so, nullptr, budget);
  }
}

void MuxLink::throwStreamEnd(const Stream& s) {
  drainDead();
  auto it = inboxes_.find({s.selfNonce, s.peerRank});
  throwEnded(s, it != inboxes_.end() ? it->second.end : kOpen);
}

void MuxLink::dieOnError(const char* op) {
  die(str("broke its TCP connection (", op, ": ", std::strerror(errno), "): it died or its machine is unreachable"));
}

void MuxLink::wakeOwners() {
  for (auto& [key, box] : inboxes_)
    if (box.owned && box.wake) box.wake->wake();
}

bool MuxLink::flushTail() {
  while (tailHead_ < tail_.size()) {
    if (!deadReason_.empty()) return false;
    ssize_t r = ::send(sockets_.front()->fd, tail_.data() + tailHead_, tail_.size() - tailHead_,
                       MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0) {
      if (wouldBlock()) return false;
      dieOnError("send");
      return false;
    }
    tailHead_ += static_cast<size_t>(r);
  }
  tail_.clear();
  tailHead_ = 0;
  return true;
}

void MuxLink::sendControl(uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t flags, uint32_t len) {
  const ChunkHeader h = makeHeader(dstNonce, srcNonce, srcRank, flags, len);
  const char* p = reinterpret_cast<const char*>(&h);
  size_t sent = 0;
  if (flushTail()) {
    ssize_t r = ::send(sockets_.front()->fd, p, sizeof(h), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r > 0) sent = static_cast<size_t>(r);
    else if (r < 0 && !wouldBlock()) return dieOnError("send");
  }
  if (!deadReason_.empty() || sent == sizeof(h)) return;
  tail_.insert(tail_.end(), p + sent, p + sizeof(h));
  mux_.wakeRuntime();
}

size_t MuxLink::write(const Stream& s, const iovec* iov, int n) {
  std::lock_guard<std::mutex> g(mu_);
  if (!deadReason_.empty()) throwStreamEnd(s);
  auto it = inboxes_.find({s.selfNonce, s.peerRank});
  if (it == inboxes_.end())  // close() erased it: only the pipe's owner calls both
    throwComm(str("internal error: rank ", s.selfRank, " wrote a TCP stream to rank ", s.peerRank, " it closed"));
  MuxInbox& box = it->second;
  if (box.end != kOpen) throwEnded(s, box.end);
  if (!flushTail()) {
    if (!deadReason_.empty()) throwStreamEnd(s);
    return 0;
  }
  // The caller's bytes as one sequence, cut into chunks. StreamTransport
  // passes a header and a payload, so a chunk takes at most 3 entries of
  // `out`: its header and a piece of each.
  if (n > 2) throwComm(str("internal error: a TCP stream write of ", n, " pieces (at most 2)"));
  size_t total = 0;
  for (int i = 0; i < n; ++i) total += iov[i].iov_len;
  // As much as the reader gave credit for (none: a CREDIT chunk wakes the group).
  total = std::min(total, box.sendCredit);
  const size_t sent = writeChunks(s, iov, total);
  box.sendCredit -= sent;
  return sent;
}

size_t MuxLink::writeChunks(const Stream& s, const iovec* iov, size_t total) {
  int at = 0;        // iov[at] + off: the next byte to cut
  size_t off = 0;
  size_t accepted = 0;
  while (accepted < total) {
    ChunkHeader hdrs[kChunksPerCall];
    iovec out[kChunksPerCall * 3];
    size_t chunkEnd[kChunksPerCall];  // bytes of `out` up to each chunk's end
    int nOut = 0, chunks = 0;
    size_t bytes = 0, payload = 0;
    while (chunks < kChunksPerCall && accepted + payload < total) {
      const size_t take = std::min(kChunkPayload, total - accepted - payload);
      hdrs[chunks] = makeHeader(s.peerNonce, s.selfNonce, s.selfRank, kData, static_cast<uint32_t>(take));
      out[nOut++] = {&hdrs[chunks], sizeof(ChunkHeader)};
      for (size_t left = take; left > 0;) {
        const size_t piece = std::min(left, iov[at].iov_len - off);
        out[nOut++] = {static_cast<char*>(iov[at].iov_base) + off, piece};
        off += piece;
        left -= piece;
        if (off == iov[at].iov_len) ++at, off = 0;
      }
      payload += take;
      bytes += sizeof(ChunkHeader) + take;
      chunkEnd[chunks++] = bytes;
    }
    msghdr m{};
    m.msg_iov = out;
    m.msg_iovlen = static_cast<size_t>(nOut);
    ssize_t r = ::sendmsg(sockets_.front()->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0) {
      if (wouldBlock()) return accepted;
      sendFailed(s);
    }
    const size_t wrote = static_cast<size_t>(r);
    if (wrote == bytes) {
      accepted += payload;
      continue;
    }
    // Whole chunks went out; the one cut short goes to the tail, so the
    // socket's framing never depends on this group writing again.
    size_t doneBytes = 0, donePayload = 0;
    int c = 0;
    while (c < chunks && chunkEnd[c] <= wrote) {
      donePayload += chunkEnd[c] - doneBytes - sizeof(ChunkHeader);
      doneBytes = chunkEnd[c++];
    }
    accepted += donePayload;
    if (wrote > doneBytes) {
      // Copy the rest of chunk c: walk `out` from the chunk's start.
      size_t pos = 0;
      for (int i = 0; i < nOut && pos < chunkEnd[c]; ++i) {
        const size_t len = out[i].iov_len;
        const size_t lo = std::max(pos, wrote), hi = std::min(pos + len, chunkEnd[c]);
        if (hi > lo) {
          const char* b = static_cast<const char*>(out[i].iov_base) + (lo - pos);
          tail_.insert(tail_.end(), b, b + (hi - lo));
        }
        pos += len;
      }
      accepted += chunkEnd[c] - doneBytes - sizeof(ChunkHeader);
      mux_.wakeRuntime();
    }
    return accepted;
  }
  return accepted;
}

void MuxLink::deliverEnd(MuxInbox& box, uint8_t end) {
  if (box.end == kOpen) box.end = end;
  if (box.owned && box.wake) box.wake->wake();
}

// A header arrived whole: checks it and decides where the chunk goes.
// Returns false if the socket carried garbage (the link is dead then).
bool MuxLink::routeChunk(Socket& so) {
  const ChunkHeader& h = so.hdr;
  if (h.magic != kChunkMagic || h.check != chunkCheck(h) ||
      h.len > (h.flags == kCredit ? kStreamWindow : h.flags == kData ? kChunkPayload : 0)) {
    refuse(str("sent a corrupted TCP stream (chunk magic 0x", std::hex, h.magic, std::dec,
            "): mixed roce_pg versions across ranks, or something else connected"));
    return false;
  }
  const InboxKey key{h.dstNonce, h.srcRank};
  if (h.flags == kCredit) {
    // For this rank's stream to the reader: (this group's nonce, the reader's rank).
    auto it = inboxes_.find(key);
    if (it == inboxes_.end()) return true;  // closed here meanwhile
    MuxInbox& box = it->second;
    if (box.sendCredit + h.len > kStreamWindow) {
      refuse(str("gave credit for more of a stream than was sent (rank ", h.srcRank,
              "): mixed roce_pg versions across ranks, or a peer that does not follow the protocol"));
      return false;
    }
    box.sendCredit += h.len;
    if (box.owned && box.wake) box.wake->wake();  // its group may wait to write
    return true;
  }
  if (h.flags == kOpenStream) {
    // Only a group gone here answers; otherwise the stream's first data
    // (or nothing) follows.
    if (!deadReason_.empty()) return true;  // drained after death: nobody to answer
    Wakeup* wake = nullptr;
    int closedRank = -1;
    if (!inboxes_.count(key) && mux_.fate(h.dstNonce, h.srcRank, &wake, &closedRank, false) == TcpMux::Fate::Closed &&
        answerGoneOnce(h.dstNonce, h.srcNonce))
      sendControl(h.srcNonce, h.dstNonce, closedRank, kGone);
    return true;
  }
  if (h.flags == kGone) {
    auto it = inboxes_.find(key);
    if (it != inboxes_.end()) deliverEnd(it->second, kGroupGone);
    return true;
  }
  auto it = inboxes_.find(key);
  if (it == inboxes_.end() && !deadReason_.empty()) {
    // Drained after death: only streams that exist here learn their end.
    so.dropChunk(key, h);
    return true;
  }
  if (it == inboxes_.end()) {
    Wakeup* wake = nullptr;
    int closedRank = -1;
    const auto fate = mux_.fate(h.dstNonce, h.srcRank, &wake, &closedRank, true);
    if (fate == TcpMux::Fate::Closed) {
      // The group is gone here: tell the sender once, drop the chunk.
      if (h.flags == kData && answerGoneOnce(h.dstNonce, h.srcNonce))
        sendControl(h.srcNonce, h.dstNonce, closedRank, kGone);
      so.dropChunk(key, h);
      return true;
    }
    if (fate == TcpMux::Fate::Unknown) {
      if (parkedStreams() >= kMaxParkedStreams) {
        refuse(str("opened more than ", kMaxParkedStreams, " streams for groups not created here: create the same "
                "process groups in the same order on every rank (or a peer that does not follow the protocol)"));
        return false;
      }
      ROCE_TRACE("tcp: a stream from rank ", h.srcRank, " of a group not created here yet (key ", std::hex,
                 h.dstNonce, std::dec, ") is kept until it is");
    }
    MuxInbox& box = inboxes_[key];
    box.owned = fate == TcpMux::Fate::Owned;
    box.wake = wake;
    box.peerNonce = h.srcNonce;
    box.since = Clock::now();
    if (wake) wake->wake();
    it = inboxes_.find(key);
  }
  if (h.flags == kClose) {
    deliverEnd(it->second, kClosed);
    return true;
  }
  const size_t parkedLimit = NetworkBudgets::get().parkedStreamBytes;
  if (!it->second.owned && !it->second.discard && parkedBytes() + h.len > parkedLimit) {
    refuse(str("sent more than ", parkedLimit >> 20, " MiB for groups not created here: create the same process "
               "groups in the same order on every rank, and within minutes of each other (or raise "
               "ROCE_PG_NET_PARKED_STREAM_BYTES)"));
    return false;
  }
  // Flow control bounds what a stream's sender may have unread here.
  if (!it->second.discard && it->second.buffered() + h.len > kStreamWindow) {
    refuse(str("sent rank ", h.srcRank, "'s stream past its window (", it->second.buffered() + h.len, " bytes unread, ",
            kStreamWindow, " allowed): mixed roce_pg versions across ranks, or a peer that does not follow the "
            "protocol"));
    return false;
  }
  // A chunk for a stream its group abandoned is dropped whole: credited now.
  if (it->second.abandonedBy >= 0)
    credit(it->second.peerNonce, key.first, it->second.abandonedBy, it->second, h.len, kCreditEvery);
  so.key = key;
  so.discard = it->second.discard;
  so.remaining = h.len;
  so.inChunk = h.len > 0;
  return true;
}

// Reads on `so` until it would block, a chunk for `self` (if any) is next
// (returns true), the budget for others' bytes is spent, or the link died.
bool MuxLink::pump(Socket& so, const InboxKey* self, size_t& budget) {
  if (self) lastPump_ = Clock::now();  // a group reads: the runtime thread need not
  for (;;) {
    if (!so.inChunk) {
      ssize_t r = ::recv(so.fd, reinterpret_cast<char*>(&so.hdr) + so.hdrGot, sizeof(ChunkHeader) - so.hdrGot,
                         MSG_DONTWAIT);
      if (r == 0) return die(kEofText), false;
      if (r < 0) {
        if (!wouldBlock()) dieOnError("receive");
        return false;
      }
      so.hdrGot += static_cast<size_t>(r);
      if (so.hdrGot < sizeof(ChunkHeader)) continue;
      so.hdrGot = 0;
      if (!routeChunk(so)) return false;
      continue;
    }
    auto it = so.discard ? inboxes_.end() : inboxes_.find(so.key);
    if (!so.discard && it == inboxes_.end()) so.discard = true;  // its group closed meanwhile
    if (!so.discard && self && so.key == *self && it->second.buffered() == 0) return true;
    if (budget == 0) return false;
    const size_t want = std::min(so.remaining, budget);
    char* dst;
    if (so.discard || it->second.discard) {
      scratch_.resize(std::min<size_t>(want, 1 << 20));
      dst = scratch_.data();
    } else {
      MuxInbox& box = it->second;
      if (box.head > 0 && box.head == box.data.size()) box.data.clear(), box.head = 0;
      box.data.resize(box.data.size() + want);
      dst = box.data.data() + box.data.size() - want;
    }
    const size_t room = so.discard || it->second.discard ? scratch_.size() : want;
    ssize_t r = ::recv(so.fd, dst, room, MSG_DONTWAIT);
    const size_t got = r > 0 ? static_cast<size_t>(r) : 0;
    if (!so.discard && !it->second.discard) {
      MuxInbox& box = it->second;
      box.data.resize(box.data.size() - want + got);
      if (got && box.owned && box.wake) box.wake->wake();
    }
    if (r == 0) return die(kEofText), false;
    if (r < 0) {
      if (!wouldBlock()) dieOnError("receive");
      return false;
    }
    so.remaining -= got;
    budget -= std::min(budget, got);
    if (so.remaining == 0) so.inChunk = false;
  }
}

size_t MuxLink::read(const Stream& s, void* dst, size_t n) {
  std::lock_guard<std::mutex> g(mu_);
  const InboxKey self{s.selfNonce, s.peerRank};
  auto takeBuffered = [&](MuxInbox& box) {
    const size_t k = std::min(n, box.buffered());
    std::memcpy(dst, box.data.data() + box.head, k);
    box.head += k;
    if (box.head == box.data.size()) box.data.clear(), box.head = 0;
    else if (box.head >= (1u << 20) && box.head * 2 >= box.data.size())  // keep a long-lived inbox compact
      box.data.erase(box.data.begin(), box.data.begin() + static_cast<std::ptrdiff_t>(box.head)), box.head = 0;
    took(s, box, k);
    return k;
  };
  auto it = inboxes_.find(self);
  if (it == inboxes_.end())  // close() erased it: only the pipe's owner calls both
    throwComm(str("internal error: rank ", s.selfRank, " read a TCP stream from rank ", s.peerRank, " it closed"));
  // The link died: what the peer sent before is still read, then its end.
  auto afterDeath = [&]() -> size_t {
    drainDead();
    auto box = inboxes_.find(self);
    if (box->second.buffered()) return takeBuffered(box->second);
    throwEnded(s, box->second.end);
  };
  if (it->second.buffered()) return takeBuffered(it->second);
  if (it->second.end != kOpen) throwEnded(s, it->second.end);
  if (!deadReason_.empty()) return afterDeath();
  size_t budget = kReadBudget;
  for (auto& sp : sockets_) {
    Socket& so = *sp;
    if (!pump(so, &self, budget)) {
      if (!deadReason_.empty()) break;
      continue;
    }
    ssize_t r = ::recv(so.fd, dst, std::min(n, so.remaining), MSG_DONTWAIT);
    if (r > 0) {
      so.remaining -= static_cast<size_t>(r);
      if (so.remaining == 0) so.inChunk = false;
      took(s, it->second, static_cast<size_t>(r));
      return static_cast<size_t>(r);
    }
    if (r < 0 && wouldBlock()) continue;  // the rest of our chunk is on its way: read the other sockets meanwhile
    if (r == 0) die(kEofText);
    else dieOnError("receive");
    break;
  }
  // What pumping the socket delivered to this stream (an end, or nothing).
  it = inboxes_.find(self);
  if (it->second.buffered()) return takeBuffered(it->second);
  if (it->second.end != kOpen) throwEnded(s, it->second.end);
  if (!deadReason_.empty()) return afterDeath();
  return 0;
}

void MuxLink::took(const Stream& s, MuxInbox& box, size_t n) {
  credit(s.peerNonce, s.selfNonce, s.selfRank, box, n, kCreditEvery);
}

void MuxLink::credit(uint64_t peerNonce, uint64_t selfNonce, int selfRank, MuxInbox& box, size_t n, size_t atLeast) {
  box.taken += n;
  if (box.taken < atLeast || box.taken == 0 || !peerNonce || !deadReason_.empty()) return;
  sendControl(peerNonce, selfNonce, selfRank, kCredit, static_cast<uint32_t>(box.taken));
  box.taken = 0;
}

bool MuxLink::answerGoneOnce(uint64_t goneNonce, uint64_t askerNonce) {
  // Forgotten when this many, so that the set cannot grow without limit (a
  // GONE may then be answered twice).
  constexpr size_t kMaxGoneAnswered = 1 << 16;
  if (goneSent_.size() >= kMaxGoneAnswered) goneSent_.clear();
  return goneSent_.insert({goneNonce, askerNonce}).second;
}

bool MuxLink::hasBuffered(const Stream& s) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = inboxes_.find({s.selfNonce, s.peerRank});
  return it != inboxes_.end() && (it->second.buffered() > 0 || it->second.end != kOpen);
}

void MuxLink::addPollFds(const Stream& s, std::vector<pollfd>& fds, bool wantWrite) {
  std::lock_guard<std::mutex> g(mu_);
  // Out of credit with nothing of its own left in the tail: the socket's
  // room does not help (a writable socket would only spin the wait).
  auto it = inboxes_.find({s.selfNonce, s.peerRank});
  if (it != inboxes_.end() && it->second.sendCredit == 0 && tailHead_ == tail_.size()) wantWrite = false;
  for (size_t i = 0; i < sockets_.size(); ++i)
    fds.push_back(pollfd{sockets_[i]->fd, static_cast<short>(POLLIN | (i == 0 && wantWrite ? POLLOUT : 0)), 0});
}

// Reading is the groups' job; the runtime thread reads only a link no group
// has read for a while (a process whose groups are all idle), so that a
// GONE answer, a parked stream, a stream for a group with no pipe for that
// peer yet (a receive from any source) or the peer's EOF still happen.
bool MuxLink::idleReadable(Clock::time_point now) const {
  if (!deadReason_.empty() || now - lastPump_ < kIdleReadAfter) return false;
  return parkedBytes() < std::min(kParkedCap, NetworkBudgets::get().parkedStreamBytes);
}

size_t MuxLink::parkedBytes() const {
  size_t parked = 0;
  for (auto& [key, box] : inboxes_)
    if (!box.owned) parked += box.buffered();
  return parked;
}

size_t MuxLink::parkedStreams() const {
  // Those dropped after kParkLimit stay as markers (a group created after
  // all is told) but hold nothing.
  return static_cast<size_t>(std::count_if(inboxes_.begin(), inboxes_.end(),
                                            [](const auto& kv) { return !kv.second.owned && !kv.second.discard; }));
}

Clock::time_point MuxLink::idleDeadline(Clock::time_point now) {
  std::lock_guard<std::mutex> g(mu_);
  if (!deadReason_.empty() || idleReadable(now)) return Clock::time_point::max();  // polled already
  return now - lastPump_ < kIdleReadAfter ? lastPump_ + kIdleReadAfter : Clock::time_point::max();
}

void MuxLink::addRuntimePollFds(std::vector<pollfd>& fds, Clock::time_point now) {
  std::lock_guard<std::mutex> g(mu_);
  if (!deadReason_.empty()) return;
  const bool tail = tailHead_ < tail_.size();
  const bool idle = idleReadable(now);
  for (size_t i = 0; i < sockets_.size(); ++i) {
    const short ev = static_cast<short>((idle ? POLLIN : 0) | (i == 0 && tail ? POLLOUT : 0));
    if (ev) fds.push_back(pollfd{sockets_[i]->fd, ev, 0});
  }
}

void MuxLink::runtimePolled(const pollfd* fds, size_t n) {
  std::lock_guard<std::mutex> g(mu_);
  bool out = false, in = false;
  for (size_t i = 0; i < n; ++i) {
    out |= (fds[i].revents & POLLOUT) != 0;
    in |= (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
  if (out) flushTail();
  if (!in || !deadReason_.empty()) return;
  // A bounded share per round: the same thread sends every group's heartbeats.
  size_t budget = kRuntimeReadPerRound;
  for (auto& so : sockets_)
    if (deadReason_.empty()) pump(*so, nullptr, budget);
}

void MuxLink::drainTail(Clock::time_point until) {
  for (;;) {
    int fd;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (flushTail() || !deadReason_.empty()) return;
      fd = sockets_.front()->fd;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 50)));
  }
}

void MuxLink::dropStaleParked(Clock::time_point now) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = inboxes_.begin(); it != inboxes_.end();)
    if (!it->second.owned && !it->second.discard && now - it->second.since > kParkLimit) {
      // Its later chunks are dropped too; a group created after all is told.
      it->second.discard = true;
      it->second.end = kDropped;
      it->second.data = {};
      it->second.head = 0;
      ++it;
    } else {
      ++it;
    }
}

}  // namespace roce::transport::tcp
