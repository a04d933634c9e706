// One TCP data connection per pair of processes, shared by every group of
// the two processes: a socket per group and peer would cost a 3-D parallel
// job with 10-20 groups per rank 10-20 descriptors per peer process. The
// first group that needs a peer process dials it (ConnectionManager: the
// hello names that group's nonce, dial races resolved there); the socket
// then belongs to the process, and every later group reaches that process
// over it without dialing.
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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../common/backoff.hpp"
#include "first_contact.hpp"
#include "../../runtime/process_runtime.hpp"
#include "mux_link.hpp"

namespace roce {
class Wakeup;
}
namespace roce::transport::tcp {
using namespace roce::runtime;


// The per-process table (ProcessRuntime::get().service<TcpMux>()).
class TcpMux : public RuntimeService {
 public:
  explicit TcpMux(ProcessRuntime& runtime) : pokeRuntime_([&runtime] { runtime.poke(); }) {}
  // Without the process's runtime (tests/fuzz/fuzz_mux_chunks.cpp):
  // `pokeRuntime` is what a link calls when the runtime thread should poll it.
  explicit TcpMux(std::function<void()> pokeRuntime) : pokeRuntime_(std::move(pokeRuntime)) {}

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
  static constexpr std::chrono::seconds kStaleClaim{5};
  FirstContact firstContact(const std::string& peerKey, uint64_t nonce);
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
  // Links ended because the peer broke the stream protocol (a corrupted
  // chunk, a stream past its window, too much parked), since the process started.
  uint64_t refusals() const { return refusals_.load(); }
  void countRefusal() { refusals_.fetch_add(1); }

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
  void wakeRuntime() { pokeRuntime_(); }
  void wakeGroups();  // rare events (a new link, a dial ended): every group looks
  std::vector<std::shared_ptr<MuxLink>> snapshot();  // the links, without holding linksMu_ after

  std::function<void()> pokeRuntime_;
  std::atomic<uint64_t> refusals_{0};
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

}  // namespace roce::transport::tcp
