// One peer process's TCP connection(s) and the streams of every group of
// the two processes over them (MuxLink), and a stream's early or unread
// bytes (MuxInbox). The design - framing, who writes and who reads, early
// streams, ends, locking - is in tcp_mux.hpp, whose table owns the links.
#pragma once
#include <poll.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../common/backoff.hpp"
#include "mux_chunk.hpp"

namespace roce {
class Wakeup;
}
namespace roce::transport::tcp {

class TcpMux;

// The bytes of one group's stream from one peer rank that arrived before the
// group read them, and how the stream ended.
struct MuxInbox {
  std::vector<char> data;
  size_t head = 0;          // data[head..] not read yet
  bool owned = false;       // the group exists here (else parked until it does)
  bool discard = false;     // the group gave up on this peer: drop what comes
  uint8_t end = 0;          // non-zero: the stream ended after `data` (mux_link.cpp: End)
  Wakeup* wake = nullptr;   // the owning group's
  uint64_t peerNonce = 0;   // the sender's nonce (for CLOSE), once known
  Clock::time_point since;  // parked since
  // The other direction of the same (group, peer) pair: what this rank may
  // still send on its stream to the peer (mux_chunk.hpp: flow control).
  size_t sendCredit = kStreamWindow;
  size_t taken = 0;  // bytes the reader took since it last gave credit back
  // Set when the group abandons the stream: the bytes it drops are credited
  // under this rank, so that the sender never waits for a reader that gave up.
  int abandonedBy = -1;
  size_t buffered() const { return data.size() - head; }
};

// The sockets to one peer process and the streams over them.
class MuxLink {
 public:
  explicit MuxLink(TcpMux& mux);
  ~MuxLink();
  MuxLink(const MuxLink&) = delete;
  MuxLink& operator=(const MuxLink&) = delete;

  // A stream of group `selfNonce` (this rank: `selfRank`) with `peerRank`
  // (its nonce: `peerNonce`). `peerText` names the peer in errors.
  struct Stream {
    uint64_t selfNonce, peerNonce;
    int selfRank, peerRank;
    std::string peerText;
  };
  // Claims the stream's inbox (a parked one, with what it holds).
  void open(const Stream& s, Wakeup* wake);
  // A group registered here takes the streams that arrived before it did.
  std::vector<int> claimParked(uint64_t nonce, Wakeup* wake);
  // A destroyed group's streams that never got a pipe: dropped, their
  // senders told (CLOSE).
  void dropGroup(uint64_t nonce, int rank);
  // Drops the inbox and sends CLOSE (the group is destroyed, or gave up).
  void close(const Stream& s);
  // Drops what arrives for the stream from now on (its peer failed here).
  void abandon(const Stream& s);

  // BytePipe semantics: bytes of the stream moved (0: would block); throw
  // Error(Comm) once the stream ended or the process is gone.
  size_t write(const Stream& s, const iovec* iov, int n);
  size_t read(const Stream& s, void* dst, size_t n);
  bool hasBuffered(const Stream& s);
  // The link's sockets, readable always; writable when `wantWrite` and the
  // stream could send (out of credit, it waits for a CREDIT chunk, which
  // reads in or wakes its group).
  void addPollFds(const Stream& s, std::vector<pollfd>& fds, bool wantWrite);
  int sendFd();
  std::string address();  // the peer's "a.b.c.d:port", for messages

  void addSocket(int fd, std::string addr);
  bool alive();
  // Runtime thread: the tail's socket, flushed when writable, and the
  // sockets of a link no group read for a while (idle reading); returns when
  // to look again.
  void addRuntimePollFds(std::vector<pollfd>& fds, Clock::time_point now);
  void runtimePolled(const pollfd* fds, size_t n);
  // When this link, read by a group now, becomes one the runtime reads.
  Clock::time_point idleDeadline(Clock::time_point now);
  // Waits until `until` at most for the tail to go out (a group's last words).
  void drainTail(Clock::time_point until);
  void dropStaleParked(Clock::time_point now);
  size_t sockets();
  size_t parked();  // streams for groups not created here yet

 private:
  struct Socket;
  using InboxKey = std::pair<uint64_t, int>;  // (receiving nonce, sending rank)

  // All under mu_.
  bool flushTail();
  void sendControl(uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t flags, uint32_t len = 0);
  // The reader of `s` took `n` bytes of it: credit goes back in batches.
  void took(const Stream& s, MuxInbox& box, size_t n);
  // The same for the stream from `peerNonce` to (`selfNonce`, `selfRank`)
  // that `box` holds; `atLeast` bytes make a batch.
  void credit(uint64_t peerNonce, uint64_t selfNonce, int selfRank, MuxInbox& box, size_t n, size_t atLeast);
  bool routeChunk(Socket& so);
  // Cuts `total` bytes of `iov` into chunks of `s` and sends what the
  // socket takes (a chunk cut short goes to the tail); returns the bytes taken.
  size_t writeChunks(const Stream& s, const iovec* iov, size_t total);
  // Whether GONE is still to be sent for (gone group, asker).
  bool answerGoneOnce(uint64_t goneNonce, uint64_t askerNonce);
  bool pump(Socket& so, const InboxKey* self, size_t& budget);
  bool idleReadable(Clock::time_point now) const;
  size_t parkedBytes() const;    // held for groups not created here
  size_t parkedStreams() const;  // their streams
  void die(const std::string& why);
  void refuse(const std::string& why);  // dies of what the peer sent against the protocol (counted)
  void dieOnError(const char* op);  // after a failed send/recv: errno names why
  // A send on `s` failed (errno): dies, and throws how the stream ended.
  [[noreturn]] void sendFailed(const Stream& s);
  // The link is dead: reads what the peer sent before it went.
  void drainDead();
  // The link is dead: throws how `s` ended, from what the peer sent before.
  [[noreturn]] void throwStreamEnd(const Stream& s);
  void wakeOwners();
  void deliverEnd(MuxInbox& box, uint8_t end);
  [[noreturn]] void throwEnded(const Stream& s, uint8_t end);

  TcpMux& mux_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Socket>> sockets_;  // the first is the one this process sends on
  std::map<InboxKey, MuxInbox> inboxes_;
  std::vector<char> tail_;  // the rest of a chunk the socket took only partly, then control chunks
  size_t tailHead_ = 0;
  std::string deadReason_;  // the peer process is gone ("closed its TCP connection")
  bool refused_ = false;    // it died of what the peer sent against the protocol
  std::vector<char> scratch_;  // chunks nobody here wants
  Clock::time_point lastPump_{};  // when a thread last read the sockets
  std::set<std::pair<uint64_t, uint64_t>> goneSent_;  // (gone nonce, asker's nonce): GONE sent once
};

}  // namespace roce::transport::tcp
