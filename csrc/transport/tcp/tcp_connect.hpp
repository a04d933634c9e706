// Establishing TCP connections between the ranks of a group, for the TCP
// transport's mesh and for the lifelines (csrc/comm/lifeline.*).
//
// Every connection starts with a fixed-size Hello from the dialer naming the
// purpose, both ranks and the dialer's per-group random nonce (published in the
// store with its rank info). The acceptor reads hellos from any number of
// half-open connections at once under short deadlines, so a stray client that
// never speaks cannot stall init, and a connection from another group, an old
// incarnation of this one or an unrelated local process is closed before
// anything is allocated for it. Connections for a purpose not asked for yet are
// kept until asked for: ranks run their setup steps at different speeds.
#pragma once
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../common/backoff.hpp"

namespace roce {

class TcpListener;

enum class LinkKind : uint16_t { Mesh = 1, Lifeline = 2 };

// Owns a socket descriptor (closes it unless released).
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() { int f = fd_; fd_ = -1; return f; }

 private:
  int fd_;
};

struct TcpEndpoint {
  std::string host;  // address to dial (127.0.0.1 for peers on this very host)
  int port = 0;
};

// Connects to `peer` and sends the hello. Each attempt's connect() is bounded;
// refused connections are retried until `deadline` (the peer may not listen
// yet), calling `probe` about once a second meanwhile (it throws when the peer
// is known never to come: a lifeline peer that refuses connections, see group_setup.cpp).
UniqueFd dialRank(const TcpEndpoint& ep, LinkKind kind, int self, int peer, uint64_t selfNonce,
                  Clock::time_point deadline, const std::function<void()>& probe = nullptr);

// ---- Non-blocking pieces, for connections made on demand ------------------
// (csrc/comm/connection_manager.*). A data connection (LinkKind::Mesh) is
// used only after the acceptor answered its hello: when two ranks dial each
// other at once, the acceptor tells the loser its dial was superseded.
enum class HelloReply : uint16_t { Accepted = 1, Superseded = 2 };

// Starts a non-blocking connect() to `ep`; the socket polls writable once it
// completed (then connectResult()). Throws on local failures (no descriptors).
UniqueFd startDial(const TcpEndpoint& ep, int peer);
// 0 once the connect() succeeded, else its errno.
int connectResult(int fd);
// Sends the hello (or the reply) on a connected socket: 24 (8) bytes always
// fit an empty socket buffer. False if the other end is already gone.
bool sendHello(int fd, LinkKind kind, int self, int peer, uint64_t selfNonce);
bool sendReply(int fd, HelloReply reply);
// Whether nothing listens at `ep` any more (the connection is refused within
// a short bound; anything else, a timeout included, counts as "maybe alive").
bool refusesConnections(const TcpEndpoint& ep);
// The acceptor's reply once all of it arrived; nullopt while it has not.
// Throws (naming `peer`) if the connection closed or the reply is garbage.
std::optional<HelloReply> readReply(int fd, int peer);

class TcpAcceptor {
 public:
  // nonces[r] is what rank r published; hellos must carry it.
  TcpAcceptor(TcpListener& listener, int self, std::vector<uint64_t> nonces);
  ~TcpAcceptor();
  TcpAcceptor(const TcpAcceptor&) = delete;
  TcpAcceptor& operator=(const TcpAcceptor&) = delete;

  // The connection `peer` dialed for `kind`; accepts (and keeps) others meanwhile.
  // `what` names the setup step in the timeout message; `probe` as for dialRank.
  UniqueFd take(LinkKind kind, int peer, Clock::time_point deadline, const std::string& what,
                const std::function<void()>& probe = nullptr);
  // Non-blocking: accepts what is waiting and reads the hellos that arrived.
  void service();
  // The listening socket and the half-open connections, for poll().
  void addPollFds(std::vector<pollfd>& fds) const;
  // A connection some peer dialed for `kind`, if one is ready: (peer, socket).
  std::optional<std::pair<int, UniqueFd>> takeAny(LinkKind kind);

 private:
  struct Pending;
  void acceptNew();
  void readHellos();

  TcpListener& listener_;
  int self_;
  std::vector<uint64_t> nonces_;
  std::vector<Pending> pending_;
  std::map<std::pair<int, int>, int> ready_;  // (kind, peer) -> fd
};

void setNonBlocking(int fd, bool on);
// TCP_NODELAY, and keepalive probes so that a peer machine that vanished is
// noticed by the kernel even when no data flows.
void tuneSocket(int fd);
// "a.b.c.d:port" of the remote end.
std::string peerAddress(int fd);

}  // namespace roce
