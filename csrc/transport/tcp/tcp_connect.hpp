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
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
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
// refused connections are retried until `deadline` (the peer may not listen yet).
UniqueFd dialRank(const TcpEndpoint& ep, LinkKind kind, int self, int peer, uint64_t selfNonce,
                  Clock::time_point deadline);

class TcpAcceptor {
 public:
  // nonces[r] is what rank r published; hellos must carry it.
  TcpAcceptor(TcpListener& listener, int self, std::vector<uint64_t> nonces);
  ~TcpAcceptor();
  TcpAcceptor(const TcpAcceptor&) = delete;
  TcpAcceptor& operator=(const TcpAcceptor&) = delete;

  // The connection `peer` dialed for `kind`; accepts (and keeps) others meanwhile.
  // `what` names the setup step in the timeout message.
  UniqueFd take(LinkKind kind, int peer, Clock::time_point deadline, const std::string& what);

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
