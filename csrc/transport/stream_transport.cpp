#include "stream_transport.hpp"

#include <cstdint>
#include <cstring>

#include "../common/config.hpp"
#include "../common/error.hpp"

namespace roce::transport {
namespace {

constexpr uint32_t kFrameMagic = 0x52504746;  // "RPGF"
// A message larger than this cannot be a real one (it would not fit in any
// machine's memory); a header claiming it is corrupted.
constexpr uint64_t kMaxFrameBytes = 1ull << 42;

uint32_t frameCheck(uint64_t tag, uint64_t len) {
  uint64_t x = tag * 0x9e3779b97f4a7c15ull ^ (len + 0x632be59bd9b4e019ull);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  return static_cast<uint32_t>(x ^ (x >> 32));
}

}  // namespace

StreamTransport::FrameHeader StreamTransport::makeHeader(const Request& r) const {
  FrameHeader h{kFrameMagic, frameCheck(r.tag, r.len), r.tag, r.len};
  // Fault injection for tests (ROCE_PG_TEST_FAULT=garbage_frames): what a
  // corrupted stream or a wrong process on the other end would send.
  if (testFault() == "garbage_frames") h = FrameHeader{0xdeadbeef, 0x12345678, ~r.tag, r.len * 977 + 12345};
  return h;
}

StreamTransport::StreamTransport(int rank, std::vector<std::unique_ptr<BytePipe>> pipes, bool copiesPayload)
    : rank_(rank), peers_(pipes.size()), copiesPayload_(copiesPayload) {
  for (size_t i = 0; i < pipes.size(); ++i)
    if (pipes[i]) addPipe(static_cast<int>(i), std::move(pipes[i]));
}

StreamTransport::Peer& StreamTransport::peer_(int p) {
  auto& slot = peers_.at(p);
  if (!slot) {
    slot = std::make_unique<Peer>();
    live_.push_back(p);
  }
  return *slot;
}

void StreamTransport::addPipe(int peer, std::unique_ptr<BytePipe> pipe) { peer_(peer).pipe = std::move(pipe); }

void StreamTransport::postSend(Request* r) {
  Peer& p = peer_(r->peer);
  if (!p.deadReason.empty()) return r->fail(p.deadReason, p.deadByEnding);
  p.sendq.push_back(r);
}

std::string StreamTransport::sizeMismatch(int peer, const Request& r, uint64_t got) const {
  return str("rank ", rank_, " expected a message of ", r.len, " bytes from rank ", peer,
             " but rank ", peer, " sent ", got,
             " bytes: every rank must pass tensors of the same size and dtype to this operation");
}

// Completes a receive from a message that was buffered before it was posted.
void StreamTransport::deliverBuffered(int peer, Request* r, const std::vector<char>& msg) {
  if (msg.size() != r->len) return r->fail(sizeMismatch(peer, *r, msg.size()));
  if (r->len) std::memcpy(r->buf, msg.data(), r->len);
  countCopied(r->len);
  r->done = true;
}

void StreamTransport::postRecv(Request* r) {
  Peer& p = peer_(r->peer);
  auto it = p.unmatched.find(r->tag);
  if (it != p.unmatched.end() && !it->second.empty()) {
    deliverBuffered(r->peer, r, it->second.front());
    it->second.pop_front();
    if (it->second.empty()) p.unmatched.erase(it);
    return;
  }
  if (!p.deadReason.empty()) return r->fail(p.deadReason, p.deadByEnding);
  p.posted[r->tag].push_back(r);
}

bool StreamTransport::hasUnmatched(int peer, uint64_t tag) {
  if (!hasPipe(peer)) return false;
  Peer& p = *peers_[peer];
  auto it = p.unmatched.find(tag);
  if (it != p.unmatched.end() && !it->second.empty()) return true;
  // A message still streaming in with no receive waiting for it counts too.
  return p.inPayload && !p.matched && !p.drainOnly && p.recvHdr.tag == tag;
}

bool StreamTransport::progress() {
  bool moved = false;
  for (int i : live_) {
    Peer& p = *peers_[i];
    if (!p.pipe || !p.deadReason.empty()) continue;
    try {
      bool m = progressSend(i, p);
      m |= progressRecv(i, p);
      if (m) p.pipe->moved();
      moved |= m;
    } catch (const PeerEndedError& e) {
      killPeer(i, p, e.what(), /*peerEnded=*/true);
      moved = true;
    } catch (const Error& e) {
      killPeer(i, p, e.what());
      moved = true;
    } catch (const std::bad_alloc&) {
      killPeer(i, p,
               str("out of memory buffering a ", p.recvHdr.len, "-byte message from rank ", i,
                   " that arrived before its receive was posted"));
      moved = true;
    }
  }
  return moved;
}

bool StreamTransport::progressSend(int peer, Peer& p) {
  bool moved = false;
  while (!p.sendq.empty()) {
    Request* r = p.sendq.front();
    if (p.sendPos == 0) p.sendHdr = makeHeader(*r);
    const size_t hdr = sizeof(FrameHeader);
    iovec iov[2];
    int n = 0;
    if (p.sendPos < hdr) iov[n++] = {reinterpret_cast<char*>(&p.sendHdr) + p.sendPos, hdr - p.sendPos};
    size_t payloadDone = p.sendPos > hdr ? p.sendPos - hdr : 0;
    if (r->len > payloadDone) iov[n++] = {static_cast<char*>(r->buf) + payloadDone, r->len - payloadDone};
    size_t wrote = n ? p.pipe->write(iov, n) : 0;
    p.sendPos += wrote;
    moved |= wrote > 0;
    if (p.sendPos == hdr + r->len) {
      if (copiesPayload_) countCopied(r->len);
      r->done = true;
      p.sendq.pop_front();
      p.sendPos = 0;
      moved = true;
    } else {
      break;  // pipe full
    }
  }
  (void)peer;
  return moved;
}

bool StreamTransport::progressRecv(int peer, Peer& p) {
  bool moved = false;
  for (;;) {
    if (!p.inPayload) {
      size_t got = p.pipe->read(reinterpret_cast<char*>(&p.recvHdr) + p.hdrGot,
                                sizeof(FrameHeader) - p.hdrGot);
      if (got == 0) return moved;
      moved = true;
      p.hdrGot += got;
      if (p.hdrGot < sizeof(FrameHeader)) continue;
      p.hdrGot = 0;
      onHeader(peer, p);
    }
    while (p.remaining > 0) {
      const size_t room = p.matched ? p.remaining : roomForUnmatched(p);
      size_t got = p.pipe->read(p.dst, room);
      if (got == 0) return moved;
      moved = true;
      p.dst += got;
      p.remaining -= got;
    }
    onPayloadDone(peer, p);
  }
}

void StreamTransport::onHeader(int peer, Peer& p) {
  const FrameHeader& h = p.recvHdr;
  if (h.magic != kFrameMagic || h.check != frameCheck(h.tag, h.len) || h.len > kMaxFrameBytes)
    throwComm(str("rank ", rank_, " received a corrupted frame header from rank ", peer, " (magic 0x", std::hex,
                  h.magic, ", length ", std::dec, h.len, "): the stream from that rank cannot be trusted any more. "
                  "Mixed roce_pg versions across ranks, or memory corruption in that process"));
  p.inPayload = true;
  p.matched = nullptr;
  p.drainOnly = false;
  p.remaining = p.recvHdr.len;
  auto it = p.posted.find(p.recvHdr.tag);
  if (it != p.posted.end() && !it->second.empty()) {
    Request* r = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) p.posted.erase(it);
    if (r->len == p.recvHdr.len) {
      p.matched = r;
      p.dst = static_cast<char*>(r->buf);
      return;
    }
    // Fail the receive but still consume the payload so the stream stays framed.
    r->fail(sizeMismatch(peer, *r, p.recvHdr.len));
    p.drainOnly = true;
  }
  // Grown as the bytes arrive (roomForUnmatched), never sized by the header
  // alone: a peer's header claiming terabytes costs nothing until they come.
  p.unmatchedBuf.clear();
  p.dst = p.unmatchedBuf.data();
}

size_t StreamTransport::roomForUnmatched(Peer& p) {
  std::vector<char>& buf = p.unmatchedBuf;
  const size_t used = static_cast<size_t>(p.dst - buf.data());
  if (used == buf.size()) {
    if (p.drainOnly && used > 0) {
      p.dst = buf.data();  // a failed receive's payload: read it through one buffer, keep nothing
      return buf.size() < p.remaining ? buf.size() : p.remaining;
    }
    // Doubling from 64 KiB: the copies stay linear in what arrived.
    const size_t grown = used + std::min(p.remaining, std::max<size_t>(used, size_t(64) << 10));
    buf.resize(grown);
    p.dst = buf.data() + used;
  }
  return std::min(buf.size() - used, p.remaining);
}

void StreamTransport::onPayloadDone(int peer, Peer& p) {
  (void)peer;
  p.inPayload = false;
  if (copiesPayload_) countCopied(p.recvHdr.len);
  if (p.matched) {
    p.matched->done = true;
    p.matched = nullptr;
    return;
  }
  if (p.drainOnly) {
    p.unmatchedBuf.clear();
    return;
  }
  // A receive may have been posted while the payload was streaming in.
  auto it = p.posted.find(p.recvHdr.tag);
  if (it != p.posted.end() && !it->second.empty()) {
    Request* r = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) p.posted.erase(it);
    deliverBuffered(peer, r, p.unmatchedBuf);
    p.unmatchedBuf.clear();
    return;
  }
  p.unmatched[p.recvHdr.tag].push_back(std::move(p.unmatchedBuf));
  p.unmatchedBuf = {};
}

std::string StreamTransport::checkPeers() {
  std::string firstDead;
  for (int i : live_) {
    Peer& p = *peers_[i];
    if (!p.pipe) continue;
    if (p.deadReason.empty()) {
      try {
        p.pipe->checkAlive();
      } catch (const Error& e) {
        killPeer(i, p, e.what());
      }
    }
    if (firstDead.empty()) firstDead = p.deadReason;
  }
  return firstDead;
}

bool StreamTransport::prepareWait(std::vector<pollfd>& fds, bool anySource) {
  const size_t first = fds.size();
  silentPeers_ = false;
  for (int i : live_) {
    Peer& p = *peers_[i];
    // A dead peer's socket stays readable (EOF) forever: never wait on it. A
    // peer not connected yet has no descriptor: the connection manager's
    // sockets announce its connection.
    if (!p.pipe || !p.deadReason.empty()) continue;
    if (p.pipe->hasBuffered()) {
      fds.resize(first);
      return false;
    }
    if (p.pipe->pollFd() >= 0) {
      p.pipe->addPollFds(fds, !p.sendq.empty());
      continue;
    }
    // A pipe nothing announces (shared memory): only safe to ignore while
    // nothing is expected from or owed to that peer.
    if (anySource || !p.sendq.empty() || !p.posted.empty() || p.inPayload || p.hdrGot > 0) {
      fds.resize(first);
      return false;
    }
    silentPeers_ = true;
  }
  return true;
}

void StreamTransport::killPeer(int peer, Peer& p, const std::string& why, bool peerEnded) {
  (void)peer;
  p.deadReason = why;
  p.deadByEnding = peerEnded;
  if (p.pipe) p.pipe->abandon();
  for (Request* r : p.sendq) r->fail(why, peerEnded);
  p.sendq.clear();
  for (auto& [tag, q] : p.posted)
    for (Request* r : q) r->fail(why, peerEnded);
  p.posted.clear();
  if (p.matched) p.matched->fail(why, peerEnded);
  p.matched = nullptr;
}

void StreamTransport::closePipes() {
  for (int i : live_) peers_[i]->pipe.reset();
}

void StreamTransport::failAll(const std::string& why) {
  for (int i : live_) killPeer(i, *peers_[i], why);
}

}  // namespace roce::transport
