// One TCP data connection per pair of processes, shared by every group of
// the two processes (issue 27). Before this, each group held a socket per
// peer: a 3-D parallel job with 10-20 groups per rank paid 10-20 descriptors
// per peer process. Now the first group that needs a peer process dials it
// as before (ConnectionManager: the hello names that group's nonce, dial
// races resolved there); the socket then belongs to the process, and every
// later group reaches that process over it without dialing.
//
// Framing: the bytes of one (group, sender rank) stream travel in chunks of
// at most kChunkPayload bytes, each behind a ChunkHeader naming the group
// (the receiving rank's nonce, the front desk's key for it) and the sending
// rank, so chunks of different groups interleave on the socket and each
// group's stream comes out whole and in order. StreamTransport's framing
// (messages, tags) runs unchanged inside each stream.
//
// Sending: a chunk is either written whole or, when the socket took only
// part of it, its rest is copied to the link's tail (at most one chunk plus
// control chunks), which goes out before any other chunk: whichever thread
// writes next, or the runtime thread when the socket drains (this is a
// RuntimeService). A group thus never waits on another group's thread.
//
// Receiving: whichever group's thread reads the socket reads a chunk meant
// for itself straight into its receive buffer, and a chunk meant for
// another group into that group's inbox, waking that group (its wake-up
// eventfd, the one descriptor a group keeps). A group reads its inbox before
// the socket. A chunk for a group this process has not created yet is kept
// (parked) until it is; one for a group destroyed here is dropped, and the
// sender is told once (a GONE chunk), so a send to a destroyed group fails
// as the refused dial did before.
//
// Ends: a group destroyed here sends a CLOSE chunk on each of its streams
// (its peers see it after the last data, as they saw the socket's EOF
// before); a socket's EOF or error means the peer process is gone and fails
// every group's streams to it. Reading is the groups' job: the runtime
// thread reads a link only when no group has for 20 ms (all idle), so GONE
// answers, parked streams and EOFs do not wait for a group's next operation.
// What arrives for a group before it receives is held in memory, as
// StreamTransport holds early messages; only streams for groups not created
// here yet stop the runtime's reading, at 64 MiB (a peer that streams that
// far ahead of a group's creation then meets TCP's flow control).
// Sockets live as long as both processes. Of the groups whose first contact
// with a process races, one dials and the others wait for its connection
// (firstContact; ConnectionManager::SharedDials), but the two processes may
// dial each other at once from different groups, and a dial that takes over
// 5 s (or retries) lets the waiters dial too, so a pair may get several
// sockets: each process sends on the first it adopted and reads every one.
//
// Locking: each link has a mutex (its sockets, inboxes, tail); the group
// registry has one that is only ever taken last (order: the table's links,
// a link, the registry).
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
#include "../../runtime/process_runtime.hpp"

namespace roce {

class Wakeup;
class TcpMux;

// The bytes of one group's stream from one peer rank that arrived before the
// group read them, and how the stream ended.
struct MuxInbox {
  std::vector<char> data;
  size_t head = 0;          // data[head..] not read yet
  bool owned = false;       // the group exists here (else parked until it does)
  bool discard = false;     // the group gave up on this peer: drop what comes
  uint8_t end = 0;          // non-zero: the stream ended after `data` (tcp_mux.cpp: End)
  Wakeup* wake = nullptr;   // the owning group's
  uint64_t peerNonce = 0;   // the sender's nonce (for CLOSE), once known
  Clock::time_point since;  // parked since
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
  void addPollFds(std::vector<pollfd>& fds, bool wantWrite);
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
  void sendControl(uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t flags);
  bool routeChunk(Socket& so);
  bool pump(Socket& so, const InboxKey* self, size_t& budget);
  bool idleReadable(Clock::time_point now) const;
  void die(const std::string& why);
  void dieOnError(const char* op);  // after a failed send/recv: errno names why
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
  std::vector<char> scratch_;  // chunks nobody here wants
  Clock::time_point lastPump_{};  // when a thread last read the sockets
  std::set<std::pair<uint64_t, uint64_t>> goneSent_;  // (gone nonce, asker's nonce): GONE sent once
};

// The per-process table (ProcessRuntime::tcpMux()).
class TcpMux : public RuntimeService {
 public:
  explicit TcpMux(ProcessRuntime& runtime) : runtime_(runtime) {}

  // A connection a group made to the process `peerKey` (owned from now on).
  void adopt(const std::string& peerKey, int fd, std::string addr);
  // The link to `peerKey` if a live socket reaches it, else null.
  std::shared_ptr<MuxLink> find(const std::string& peerKey);
  bool connected(const std::string& peerKey) { return find(peerKey) != nullptr; }
  // First contact of group `nonce` with `peerKey`, in one look: a live link
  // reaches it (Linked); or nobody else of this process is dialing it, and
  // now this group is (Dial: claimed); or another group is (Wait). A claim
  // older than kStaleClaim is taken over (its group may have broken and no
  // longer drive its dial). endDial, or the group's unregistering, ends the
  // claim and wakes every group (the waiting ones look again).
  enum class Contact { Linked, Dial, Wait };
  static constexpr std::chrono::seconds kStaleClaim{5};
  Contact firstContact(const std::string& peerKey, uint64_t nonce);
  void endDial(const std::string& peerKey, uint64_t nonce);

  // A group of this process (its rank's nonce), from creation to
  // destruction. `newPeers` (the group's, outlives the registration) is set
  // when a peer's stream starts before the group attached a pipe for it.
  void registerGroup(uint64_t nonce, int rank, Wakeup* wake, std::atomic<bool>* newPeers);
  void unregisterGroup(uint64_t nonce);
  // After unregisterGroup: its streams that never got a pipe go (their
  // inboxes hold the group's wake-up, which is about to be freed).
  void dropGroup(uint64_t nonce, int rank);
  std::vector<int> takeNewPeers(uint64_t nonce);

  size_t sockets();
  size_t parkedStreams();

  Clock::time_point tick(Clock::time_point now) override;
  void addPollFds(std::vector<pollfd>& fds) override;
  void polled(const pollfd* fds, size_t n) override;

 private:
  friend class MuxLink;
  struct Group {
    int rank;
    Wakeup* wake;
    std::atomic<bool>* flag;
    std::vector<int> newPeers;
  };
  enum class Fate { Owned, Closed, Unknown };
  // Under groupsMu_ (taken last): what becomes of a chunk for `nonce`.
  // `claim`: an Owned stream is the group's new peer (takeNewPeers).
  Fate fate(uint64_t nonce, int srcRank, Wakeup** wake, int* closedRank, bool claim);
  void wakeRuntime() { runtime_.poke(); }
  void wakeGroups();  // rare events (a new link, a dial ended): every group looks
  std::vector<std::shared_ptr<MuxLink>> snapshot();  // the links, without holding linksMu_ after

  ProcessRuntime& runtime_;
  std::mutex linksMu_;
  std::unordered_map<std::string, std::shared_ptr<MuxLink>> links_;
  struct Claim {
    uint64_t nonce;  // the group dialing
    Clock::time_point since;
  };
  std::unordered_map<std::string, Claim> dialing_;  // by peer process (under linksMu_)
  // The runtime thread's: each link and how many pollfds it added this round.
  std::vector<std::pair<std::shared_ptr<MuxLink>, size_t>> polledLinks_;
  Clock::time_point nextParkCheck_{};
  std::mutex groupsMu_;
  std::unordered_map<uint64_t, Group> groups_;
  std::unordered_map<uint64_t, int> closed_;  // nonce -> the rank it was, for GONE
};

}  // namespace roce
