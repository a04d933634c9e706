#include "connect.hpp"

#include <arpa/inet.h>
#include <cstdint>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <ifaddrs.h>
#include <net/if.h>

#include "../common/config.hpp"
#include "../common/error.hpp"
#include "../common/sockets.hpp"
#include "front_desk.hpp"

namespace roce::runtime {
namespace {

// Bound on one connect() attempt, so an unroutable address cannot eat the
// whole group timeout in a single SYN retry cycle.
constexpr auto kConnectAttempt = std::chrono::seconds(5);
// How often a setup wait asks whether its peer will ever come (a store round trip).
constexpr auto kProbeEvery = std::chrono::seconds(1);

constexpr uint32_t kReplyMagic = 0x52504c59;  // "RPLY"

struct Reply {
  uint32_t magic;
  uint16_t status;   // HelloReply
  uint16_t version;  // OtherVersion: the acceptor's hello version (else 0)
};
static_assert(sizeof(Reply) == 8);


// Blocking full write with a deadline (the hello only).
void writeAll(int fd, const void* buf, size_t n, Clock::time_point deadline, const std::string& who) {
  const char* p = static_cast<const char*>(buf);
  while (n) {
    pollfd pfd{fd, POLLOUT, 0};
    long long left = msLeft(deadline);
    if (left <= 0) throwTimeout(str("TCP handshake with ", who, " timed out"));
    if (poll(&pfd, 1, static_cast<int>(std::min(left, 1000LL))) <= 0) continue;
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) throwComm(str("TCP handshake with ", who, " failed: ", std::strerror(errno)));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// One non-blocking connect() bounded by `until`; returns 0 or an errno value.
int connectOnce(int fd, const sockaddr_in& sa, Clock::time_point until) {
  setNonBlocking(fd, true);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  for (;;) {
    pollfd pfd{fd, POLLOUT, 0};
    long long left = msLeft(until);
    if (left <= 0) return ETIMEDOUT;
    int n = poll(&pfd, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    return err;
  }
}

}  // namespace

namespace {
sockaddr_in addressOf(const TcpEndpoint& ep, int peer) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(ep.port));
  if (ep.port <= 0 || ep.port > 65535 || inet_pton(AF_INET, ep.host.c_str(), &sa.sin_addr) != 1)
    throwComm(str("rank ", peer, " published an invalid TCP address '", ep.host, ":", ep.port,
                  "' (mixed roce_pg versions across ranks?)"));
  return sa;
}

// A TCP socket, bound to `source` when given and bindable.
UniqueFd newSocket(const std::string& source = {}) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throwComm(str("socket() failed: ", std::strerror(errno), " (out of file descriptors? `ulimit -n`)"));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (!source.empty() && inet_pton(AF_INET, source.c_str(), &sa.sin_addr) == 1)
    (void)!bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa));  // not ours: the peer's refusal says so
  return fd;
}
}  // namespace

UniqueFd startDial(const TcpEndpoint& ep, int peer, const std::string& source) {
  const sockaddr_in sa = addressOf(ep, peer);
  UniqueFd fd = newSocket(source);
  setNonBlocking(fd.get(), true);
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0 && errno != EINPROGRESS) {
    // Reported like a failed asynchronous connect: through SO_ERROR.
    const int err = errno;
    setsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, sizeof(err));
  }
  return fd;
}

int connectResult(int fd) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

bool refusesConnections(const TcpEndpoint& ep) {
  UniqueFd fd = startDial(ep, -1);
  pollfd p{fd.get(), POLLOUT, 0};
  if (poll(&p, 1, 200) <= 0) return false;
  // Connected (closed at once: the acceptor sees EOF before a hello and drops
  // it) or failed: only a refusal says there is no listener.
  return connectResult(fd.get()) == ECONNREFUSED;
}

PeerState probePeer(const TcpEndpoint& ep, int self, int peer, uint64_t selfNonce, uint64_t peerNonce) {
  UniqueFd fd = startDial(ep, peer);
  pollfd p{fd.get(), POLLOUT, 0};
  if (poll(&p, 1, 200) <= 0) return PeerState::Maybe;
  const int err = connectResult(fd.get());
  if (err == ECONNREFUSED) return PeerState::ProcessGone;
  if (err != 0 || !sendHello(fd.get(), LinkKind::Probe, self, peer, selfNonce, peerNonce)) return PeerState::Maybe;
  p = {fd.get(), POLLIN, 0};
  if (poll(&p, 1, 500) <= 0) return PeerState::Maybe;
  try {
    const auto reply = readReply(fd.get(), peer);
    return reply == HelloReply::Gone ? PeerState::GroupGone : PeerState::Maybe;
  } catch (const Error&) {
    return PeerState::Maybe;  // closed without an answer: an older roce_pg, or the process is exiting
  }
}

bool sendHello(int fd, LinkKind kind, int self, int peer, uint64_t selfNonce, uint64_t peerNonce) {
  const auto h = signHead(Hello{kHelloMagic, kHelloVersion, static_cast<uint16_t>(kind), self, peer, selfNonce, peerNonce});
  return send(fd, &h, sizeof(h), MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h));
}

bool sendReply(int fd, HelloReply reply) {
  Reply r{kReplyMagic, static_cast<uint16_t>(reply), 0};
  return send(fd, &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(r));
}

bool sendVersionReply(int fd) {
  Reply r{kReplyMagic, static_cast<uint16_t>(HelloReply::OtherVersion), kHelloVersion};
  return send(fd, &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(r));
}

std::optional<HelloReply> readReply(int fd, int peer) {
  Reply r{};
  ssize_t n = recv(fd, &r, sizeof(r), MSG_DONTWAIT | MSG_PEEK);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return std::nullopt;
  if (n == 0 || n < 0)
    throwComm(str("rank ", peer, " closed the connection before answering its hello (",
                  n == 0 ? "EOF" : std::strerror(errno), "): it exited or left the group, or it holds another job "
                  "secret (ROCE_PG_JOB_SECRET set differently on the two ranks)"));
  if (n < static_cast<ssize_t>(sizeof(r))) return std::nullopt;
  (void)!recv(fd, &r, sizeof(r), MSG_DONTWAIT);
  if (r.magic != kReplyMagic || r.status < static_cast<uint16_t>(HelloReply::Accepted) ||
      r.status > static_cast<uint16_t>(HelloReply::OtherVersion))
    throwComm(str("rank ", peer, " answered a connection with garbage (mixed roce_pg versions across ranks?)"));
  if (r.status == static_cast<uint16_t>(HelloReply::OtherVersion))
    throwComm(str("rank ", peer, " runs connection protocol ", r.version, ", this rank runs ", kHelloVersion,
                  ": install the same roce_pg on every machine"));
  return static_cast<HelloReply>(r.status);
}

UniqueFd dialRank(const TcpEndpoint& ep, LinkKind kind, int self, int peer, uint64_t selfNonce,
                  uint64_t peerNonce, Clock::time_point deadline, const std::function<void()>& probe,
                  const std::string& source) {
  const sockaddr_in sa = addressOf(ep, peer);
  const std::string who = str("rank ", peer, " (", ep.host, ":", ep.port, ")");
  std::string lastErr;
  Clock::time_point nextProbe = Clock::now() + kProbeEvery;
  do {
    UniqueFd fd = newSocket(source);
    int err = connectOnce(fd.get(), sa, std::min(deadline, Clock::now() + kConnectAttempt));
    if (err == 0) {
      const auto h =
          signHead(Hello{kHelloMagic, kHelloVersion, static_cast<uint16_t>(kind), self, peer, selfNonce, peerNonce});
      writeAll(fd.get(), &h, sizeof(h), deadline, who);
      return fd;
    }
    lastErr = std::strerror(err);
    if (probe && Clock::now() >= nextProbe) {
      probe();
      nextProbe = Clock::now() + kProbeEvery;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < deadline);
  throwComm(str("could not connect to ", who, ": ", lastErr,
                ". If the ranks are on different machines, check that this address is reachable "
                "and that no firewall blocks the port, or pick another interface with "
                "ROCE_PG_SOCKET_IFNAME"));
}

TcpAcceptor::TcpAcceptor(std::shared_ptr<Mailbox> mailbox, int self, std::vector<uint64_t> nonces)
    : mailbox_(std::move(mailbox)), self_(self), nonces_(std::move(nonces)) {}

TcpAcceptor::~TcpAcceptor() {
  for (auto& [key, fd] : ready_) close(fd);
}

void TcpAcceptor::service() {
  for (Arrival& a : mailbox_->takeAll()) {
    const int src = a.src;
    const bool ours = a.kind == LinkKind::Mesh && a.dst == self_ && src >= 0 &&
                      src < static_cast<int>(nonces_.size()) && src != self_ && a.srcNonce == nonces_[src] &&
                      !ready_.count({static_cast<int>(a.kind), src});
    // Not a peer of this group incarnation (a late join, a duplicate): the
    // socket closes as `a` goes.
    if (ours) ready_[{static_cast<int>(a.kind), src}] = a.fd.release();
  }
}

void TcpAcceptor::addPollFds(std::vector<pollfd>& fds) const {
  if (const int fd = mailbox_->fd(); fd >= 0) fds.push_back({fd, POLLIN, 0});
}

std::optional<std::pair<int, UniqueFd>> TcpAcceptor::takeAny(LinkKind kind) {
  for (auto it = ready_.begin(); it != ready_.end(); ++it)
    if (it->first.first == static_cast<int>(kind)) {
      std::pair<int, UniqueFd> out{it->first.second, UniqueFd(it->second)};
      ready_.erase(it);
      return out;
    }
  return std::nullopt;
}

UniqueFd TcpAcceptor::take(LinkKind kind, int peer, Clock::time_point deadline, const std::string& what,
                           const std::function<void()>& probe) {
  const std::pair<int, int> key{static_cast<int>(kind), peer};
  Clock::time_point nextProbe = Clock::now() + kProbeEvery;
  for (;;) {
    if (auto it = ready_.find(key); it != ready_.end()) {
      UniqueFd fd(it->second);
      ready_.erase(it);
      return fd;
    }
    long long left = msLeft(deadline);
    if (left <= 0)
      throwTimeout(str(what, ": rank ", self_, " timed out waiting for a TCP connection from rank ", peer,
                       " to port ", ProcessRuntime::get().desk().port(), "; check that rank's log, firewalls between the machines, "
                       "or set ROCE_PG_SOCKET_IFNAME to an interface the peers can reach"));
    if (probe && Clock::now() >= nextProbe) {
      probe();
      nextProbe = Clock::now() + kProbeEvery;
    }
    mailbox_->wait(static_cast<int>(std::min(left, 200LL)));
    service();
  }
}

std::unique_ptr<TcpListener> TcpListener::open(const std::string& address, int port, int& err) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) {
    err = EINVAL;
    return nullptr;
  }
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  socklen_t len = sizeof(sa);
  if (fd.get() < 0 || bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      listen(fd.get(), 1024) != 0 || getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    err = errno;
    return nullptr;
  }
  setNonBlocking(fd.get(), true);  // the front desk drains it with accept4 until EAGAIN
  return std::unique_ptr<TcpListener>(new TcpListener(fd.release(), ntohs(sa.sin_port), address));
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) close(fd_);
}

std::string tcpAdvertiseAddress(const Config& cfg) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return kLoopbackAddress;
  std::string chosen, seen;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof(buf));
    seen += str(seen.empty() ? "" : ", ", a->ifa_name, "=", buf);
    bool wanted = cfg.socketIfname.empty() ? !(a->ifa_flags & IFF_LOOPBACK) : cfg.socketIfname == a->ifa_name;
    if (wanted && chosen.empty()) chosen = buf;
  }
  freeifaddrs(list);
  if (chosen.empty() && !cfg.socketIfname.empty())
    throwInvalid(str("ROCE_PG_SOCKET_IFNAME=", cfg.socketIfname, " names no up IPv4 interface; "
                     "available: ", seen.empty() ? "none" : seen));
  return chosen.empty() ? std::string(kLoopbackAddress) : chosen;
}

}  // namespace roce::runtime
