// TCP connections between the ranks of a group, for the TCP transport's mesh
// and the verbs handshake, and between processes for the lifelines
// (process_links.hpp), made over the process's one listener (front_desk.hpp).
//
// Every connection starts with a fixed-size Hello (hello.hpp) from the dialer
// naming the purpose, both ranks, the dialer's per-group random nonce
// (published with its rank info) and the destination's, which the front desk
// routes by. A group's TcpAcceptor takes what the desk left in the group's
// mailbox and checks it against the roster, so a connection from an old
// incarnation or a miswired peer is closed before anything is allocated for
// it. Connections for a purpose not asked for yet are kept until asked for:
// ranks run their setup steps at different speeds.
#pragma once
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../common/backoff.hpp"
#include "../common/sockets.hpp"
#include "../common/unique_fd.hpp"
#include "hello.hpp"

namespace roce {
struct Config;
}
namespace roce::runtime {

class Mailbox;

// One of the process's listening sockets (FrontDesk owns them).
class TcpListener {
 public:
  // Listens on `address` (IPv4), port `port` (0: one the kernel picks);
  // null with `err` set (EADDRINUSE: the port is taken there) on failure.
  static std::unique_ptr<TcpListener> open(const std::string& address, int port, int& err);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  int port() const { return port_; }
  int fd() const { return fd_; }
  const std::string& address() const { return address_; }

 private:
  TcpListener(int fd, int port, std::string address) : fd_(fd), port_(port), address_(std::move(address)) {}
  int fd_ = -1;
  int port_ = 0;
  std::string address_;
};

// The IPv4 address peers on other machines should dial: the one of
// ROCE_PG_SOCKET_IFNAME if set, else the first up, non-loopback interface.
std::string tcpAdvertiseAddress(const Config& cfg);

struct TcpEndpoint {
  std::string host;  // address to dial (127.0.0.1 for peers on this very host)
  int port = 0;
};

// Connects to `peer` and sends the hello. Each attempt's connect() is bounded;
// refused connections are retried until `deadline` (the peer may not listen
// yet), calling `probe` about once a second meanwhile (it throws when the peer
// is known never to come: a lifeline neighbour's process that refuses
// connections, see group/group_builder.cpp).
// `source`: the local address the connection leaves from (a process link
// binds its advertised one, which the acceptor checks: link_identity.hpp);
// "" or one that cannot be bound: whatever the route picks.
UniqueFd dialRank(const TcpEndpoint& ep, LinkKind kind, int self, int peer, uint64_t selfNonce,
                  uint64_t peerNonce, Clock::time_point deadline, const std::function<void()>& probe = nullptr,
                  const std::string& source = {});

// ---- Non-blocking pieces, for connections made on demand ------------------
// (csrc/comm/connection_manager.*). A data connection (LinkKind::Mesh) is
// used only after the acceptor answered its hello: when two ranks dial each
// other at once, the acceptor tells the loser its dial was superseded.
// Gone: the front desk's mailbox for the hello's key was closed (the peer's
// process destroyed that group): the dialer stops trying. Keys never seen
// are parked, not answered.
// OtherVersion: the hello was of another protocol version; the answer names
// the acceptor's (kHelloVersion), and the dialer's error both.
enum class HelloReply : uint16_t { Accepted = 1, Superseded = 2, Gone = 3, OtherVersion = 4 };

// Starts a non-blocking connect() to `ep`; the socket polls writable once it
// completed (then connectResult()). Throws on local failures (no descriptors).
UniqueFd startDial(const TcpEndpoint& ep, int peer, const std::string& source = {});
// 0 once the connect() succeeded, else its errno.
int connectResult(int fd);
// Sends the hello (or the reply) on a connected socket: 32 (8) bytes always
// fit an empty socket buffer. False if the other end is already gone.
bool sendHello(int fd, LinkKind kind, int self, int peer, uint64_t selfNonce, uint64_t peerNonce);
bool sendReply(int fd, HelloReply reply);
// The answer to a hello of another version: OtherVersion, with this side's.
bool sendVersionReply(int fd);
// What a rank waiting for `peer` learns from asking (LinkKind::Probe): its
// process is gone (the connection is refused), its group there is gone (the
// front desk closed the key's mailbox), or neither (it may still come).
enum class PeerState { Maybe, ProcessGone, GroupGone };
PeerState probePeer(const TcpEndpoint& ep, int self, int peer, uint64_t selfNonce, uint64_t peerNonce);
// Whether nothing listens at `ep` any more (the connection is refused within
// a short bound; anything else, a timeout included, counts as "maybe alive").
bool refusesConnections(const TcpEndpoint& ep);
// The acceptor's reply once all of it arrived; nullopt while it has not.
// Throws (naming `peer`) if the connection closed or the reply is garbage.
std::optional<HelloReply> readReply(int fd, int peer);

class TcpAcceptor {
 public:
  // nonces[r] is what rank r published; hellos must carry it. `mailbox` is
  // where the front desk leaves connections naming nonces[self].
  TcpAcceptor(std::shared_ptr<Mailbox> mailbox, int self, std::vector<uint64_t> nonces);
  ~TcpAcceptor();
  TcpAcceptor(const TcpAcceptor&) = delete;
  TcpAcceptor& operator=(const TcpAcceptor&) = delete;

  // The connection `peer` dialed for `kind`; accepts (and keeps) others meanwhile.
  // `what` names the setup step in the timeout message; `probe` as for dialRank.
  UniqueFd take(LinkKind kind, int peer, Clock::time_point deadline, const std::string& what,
                const std::function<void()>& probe = nullptr);
  // Non-blocking: takes what the desk delivered.
  void service();
  // The mailbox's descriptor, for poll(), while it has one (a formed group's
  // mailbox calls its waker instead: Mailbox::useWaker).
  void addPollFds(std::vector<pollfd>& fds) const;
  // A connection some peer dialed for `kind`, if one is ready: (peer, socket).
  std::optional<std::pair<int, UniqueFd>> takeAny(LinkKind kind);

 private:
  std::shared_ptr<Mailbox> mailbox_;
  int self_;
  std::vector<uint64_t> nonces_;
  std::map<std::pair<int, int>, int> ready_;  // (kind, peer) -> fd
};


}  // namespace roce::runtime
