// Message framing, tag matching and unexpected-message buffering for transports
// whose peers are connected by reliable byte streams (TCP sockets, shared-memory
// rings). A concrete transport supplies one BytePipe per peer.
#pragma once
#include <cstdint>
#include <poll.h>
#include <sys/uio.h>

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport.hpp"

namespace roce::transport {

class BytePipe {
 public:
  virtual ~BytePipe() = default;
  // Non-blocking. Return the number of bytes moved (0 if it would block).
  // Throw roce::Error(Comm) when the peer is gone.
  virtual size_t write(const iovec* iov, int iovcnt) = 0;
  virtual size_t read(void* dst, size_t n) = 0;
  // Throws if the peer is known to be gone (for pipes that cannot see EOF).
  virtual void checkAlive() {}
  // A descriptor that polls readable when read() has bytes (or EOF) and
  // writable when write() can take some; -1 for pipes without one.
  virtual int pollFd() const { return -1; }
  // Several descriptors (a stream shared with other groups may span two
  // sockets): appends them, POLLIN always and POLLOUT when `wantWrite`.
  virtual void addPollFds(std::vector<pollfd>& fds, bool wantWrite) {
    fds.push_back(pollfd{pollFd(), static_cast<short>(POLLIN | (wantWrite ? POLLOUT : 0)), 0});
  }
  // Bytes (or the stream's end) that read() would return and no descriptor
  // announces any more: another thread already took them off the socket.
  virtual bool hasBuffered() const { return false; }
  // The transport gave up on this peer: what still arrives may be dropped.
  virtual void abandon() {}
  // Called after a progress round in which write() or read() moved bytes: a
  // pipe whose other end is announced otherwise (the shared-memory doorbell)
  // tells it here.
  virtual void moved() {}
};

class StreamTransport : public Transport {
 public:
  // pipes[peer] may be null for peers this transport does not serve, or does
  // not serve yet (connections made on demand arrive through addPipe).
  // copiesPayload: the pipes memcpy every byte through a staging buffer (the
  // shared-memory rings), so payload written and read counts as copied; TCP's
  // copies happen in the kernel and are not counted.
  StreamTransport(int rank, std::vector<std::unique_ptr<BytePipe>> pipes, bool copiesPayload = false);
  // A connection to `peer` became usable: requests queued for it start moving.
  void addPipe(int peer, std::unique_ptr<BytePipe> pipe);
  bool hasPipe(int peer) const { return peer < static_cast<int>(peers_.size()) && peers_[peer] && peers_[peer]->pipe; }
  void failPeer(int peer, const std::string& why) override { killPeer(peer, peer_(peer), why); }
  void postSend(Request* r) override;
  void postRecv(Request* r) override;
  bool progress() override;
  bool hasUnmatched(int peer, uint64_t tag) override;
  std::string checkPeers() override;
  void failAll(const std::string& why) override;
  bool prepareWait(std::vector<pollfd>& fds, bool anySource) override;
  bool hasSilentPeers() const override { return silentPeers_; }

 protected:
  // Destroys every pipe now (a transport whose pipes say goodbye, then
  // waits for the goodbye to leave).
  void closePipes();
  int rank_;

 private:
  // Every message starts with this header. The magic and the check word let a
  // receiver tell a corrupted or misaligned stream from a real frame before the
  // length is trusted to size a buffer or steer a copy.
  struct FrameHeader {
    uint32_t magic;
    uint32_t check;  // frameCheck(tag, len)
    uint64_t tag;
    uint64_t len;
  };
  struct Peer {
    std::unique_ptr<BytePipe> pipe;
    std::string deadReason;  // non-empty: every request to this peer fails
    bool deadByEnding = false;  // the peer ended the stream on purpose (Request::peerEnded)
    // Sending: a queue of requests, the front one partially written.
    std::deque<Request*> sendq;
    FrameHeader sendHdr{};
    size_t sendPos = 0;  // bytes of header+payload of sendq.front() written
    // Receiving: a header being read, then a payload being read into `dst`.
    FrameHeader recvHdr{};
    size_t hdrGot = 0;
    bool inPayload = false;
    char* dst = nullptr;
    size_t remaining = 0;
    Request* matched = nullptr;           // posted receive being filled, or
    std::vector<char> unmatchedBuf;       // payload arriving before its receive
    bool drainOnly = false;               // payload of a failed receive, discarded
    std::unordered_map<uint64_t, std::deque<Request*>> posted;
    std::unordered_map<uint64_t, std::deque<std::vector<char>>> unmatched;
  };

  bool progressSend(int peer, Peer& p);
  bool progressRecv(int peer, Peer& p);
  void onHeader(int peer, Peer& p);
  void onPayloadDone(int peer, Peer& p);
  // Room in p.unmatchedBuf for the payload's next bytes, growing it (or, for
  // a payload being drained, reusing it) when full; at most p.remaining.
  static size_t roomForUnmatched(Peer& p);
  void killPeer(int peer, Peer& p, const std::string& why, bool peerEnded = false);
  std::string sizeMismatch(int peer, const Request& r, uint64_t got) const;
  FrameHeader makeHeader(const Request& r) const;
  void deliverBuffered(int peer, Request* r, const std::vector<char>& msg);

  // Per-peer state exists only for peers this rank talked to (or has a pipe
  // to): memory follows the peers, not the group size. `live_` lists them.
  Peer& peer_(int p);
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<int> live_;
  bool copiesPayload_;
  bool silentPeers_ = false;  // the last prepareWait left out a live pipe without a descriptor
};

}  // namespace roce::transport
