// Connections to network peers, made when an algorithm or a point-to-point
// call first needs them. A rank's sockets, queue pairs and buffers
// then follow the peers it talks to - two ring neighbours, log2(n) partners of
// the recursive algorithms - instead of the world size. Shared by the TCP
// transport (the socket carries the data) and verbs (the socket carries the
// queue-pair handshake; then it is closed if the group's lifeline watches the
// peer, else kept for its EOF).
//
// Both ranks of a pair may ask at once: each dials, and an acceptor answers
// every data hello (HelloReply). A rank that receives a dial while its own
// dial to the same peer is outstanding keeps the lower rank's dial: the lower
// rank answers "superseded" to the higher one's, the higher rank accepts the
// lower one's and drops its own. Both reach the same decision from what they
// see locally, so exactly one connection survives and neither waits for the
// other.
//
// A transport whose connections serve every group of the process (TCP: one
// socket per pair of processes, tcp_mux.hpp) shares its dials: a group whose
// first contact with a peer process finds another group of its process
// dialing there waits for that dial (at most kSharedDialWait, then dials
// itself) instead of making a socket of its own.
//
// Runs on the progress thread (and on the creating thread for
// ROCE_PG_CONNECT=eager), never blocks: the Communicator's waits poll the
// descriptors addPollFds() returns, and progress() advances whatever is ready.
#pragma once
#include <cstdint>
#include <poll.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../common/backoff.hpp"
#include "../common/counters.hpp"
#include "../transport/tcp/first_contact.hpp"
#include "../runtime/connect.hpp"

namespace roce::comm {
using namespace roce::transport::tcp;
using namespace roce::runtime;

class ConnectionManager {
 public:
  // A connection to `peer` became usable (the hello was answered "accepted").
  using Connected = std::function<void(int peer, UniqueFd fd)>;
  // `peer` cannot be reached: its process's listener refused (it exited), or its
  // front desk answered Gone (it destroyed the group).
  using Failed = std::function<void(int peer, const std::string& why)>;

  // `endpoints` and `hostNames` (per group rank) must outlive the manager;
  // `transport` ("tcp", "verbs") is what the connections serve, for messages.
  ConnectionManager(int rank, std::string transport, const std::vector<TcpEndpoint>& endpoints,
                    const std::vector<std::string>& hostNames, const std::vector<uint64_t>& nonces,
                    std::unique_ptr<TcpAcceptor> acceptor,
                    Connected connected, Failed failed, Counters& counters);
  ~ConnectionManager();

  // How this group's dials meet the other groups' (unset: every dial is the
  // group's own). Set once, before the first want().
  struct SharedDials {
    std::function<FirstContact(int peer)> turn;  // a Dial is this group's claim until ended()
    std::function<void(int peer)> ended;   // this group's dial ended (connected or refused)
    std::function<void(int peer)> linked;  // use the existing connection
  };
  void shareDials(SharedDials s) { shared_ = std::move(s); }

  // Starts connecting to `peer` unless connected or under way (cheap to repeat).
  void want(int peer);
  bool isConnected(int peer) const { return connected_.count(peer) > 0; }
  // Advances accepts, dials and replies without blocking; true if anything
  // moved. Looks at its sockets at most every kServiceEvery unless `now` is
  // set (after a poll() said one of them is ready), so a busy wait's spin
  // costs no system call per round.
  bool progress(bool now = false);
  // The mailbox and the dials in flight.
  void addPollFds(std::vector<pollfd>& fds) const;
  // Why `peer` is not connected yet, for timeout messages ("" if it is).
  std::string status(int peer) const;
  size_t connections() const { return connected_.size(); }

 private:
  struct Dial;
  void onIncoming(int peer, UniqueFd fd);
  void dial(int peer);
  void startDial(int peer, Dial& d);
  bool advanceDeferred(Clock::time_point now);
  bool advanceDial(int peer, Dial& d, Clock::time_point now);
  void accepted(int peer, UniqueFd fd, bool ourDial);
  void refused(int peer);  // fails the peer's requests; drops its dial

  const int rank_;
  const std::string transport_;
  const std::vector<TcpEndpoint>& endpoints_;
  const std::vector<std::string>& hostNames_;
  const std::vector<uint64_t>& nonces_;  // per rank (must outlive the manager)
  std::unique_ptr<TcpAcceptor> acceptor_;
  Connected onConnected_;
  Failed onFailed_;
  Counters& counters_;
  std::unordered_map<int, std::unique_ptr<Dial>> dials_;  // by peer, while connecting
  std::unordered_map<int, Clock::time_point> awaiting_;   // our dial was superseded: theirs will come
  std::unordered_set<int> connected_;
  std::unordered_map<int, Clock::time_point> deferred_;   // waiting for another group's dial, since
  SharedDials shared_;
  Clock::time_point nextService_{};
};

}  // namespace roce::comm
