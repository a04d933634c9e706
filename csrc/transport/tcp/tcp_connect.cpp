#include "tcp_connect.hpp"

#include <arpa/inet.h>
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

#include "../../common/error.hpp"
#include "tcp_transport.hpp"

namespace roce {
namespace {

constexpr uint32_t kHelloMagic = 0x526f4345;  // "RoCE"
constexpr uint16_t kHelloVersion = 3;  // 3: data connections are answered (HelloReply)
// A dialer sends its hello right after connect(); one that has not after this
// long is not one of ours (or is hopelessly overloaded) and is dropped.
constexpr auto kHelloDeadline = std::chrono::seconds(30);
// Bound on one connect() attempt, so an unroutable address cannot eat the
// whole group timeout in a single SYN retry cycle.
constexpr auto kConnectAttempt = std::chrono::seconds(5);
// How often a setup wait asks whether its peer will ever come (a store round trip).
constexpr auto kProbeEvery = std::chrono::seconds(1);

constexpr uint32_t kReplyMagic = 0x52504c59;  // "RPLY"

struct Reply {
  uint32_t magic;
  uint16_t status;  // HelloReply
  uint16_t pad;
};
static_assert(sizeof(Reply) == 8);

struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  int32_t src;
  int32_t dst;
  uint64_t nonce;
};
static_assert(sizeof(Hello) == 24);

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

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) close(fd_);
}

void setNonBlocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void tuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 10, intvl = 5, cnt = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

std::string peerAddress(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "?";
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof(buf));
  return str(buf, ":", ntohs(sa.sin_port));
}

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

UniqueFd newSocket() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) throwComm(str("socket() failed: ", std::strerror(errno), " (out of file descriptors? `ulimit -n`)"));
  return fd;
}
}  // namespace

UniqueFd startDial(const TcpEndpoint& ep, int peer) {
  const sockaddr_in sa = addressOf(ep, peer);
  UniqueFd fd = newSocket();
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

bool sendHello(int fd, LinkKind kind, int self, int peer, uint64_t selfNonce) {
  Hello h{kHelloMagic, kHelloVersion, static_cast<uint16_t>(kind), self, peer, selfNonce};
  return send(fd, &h, sizeof(h), MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h));
}

bool sendReply(int fd, HelloReply reply) {
  Reply r{kReplyMagic, static_cast<uint16_t>(reply), 0};
  return send(fd, &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(r));
}

std::optional<HelloReply> readReply(int fd, int peer) {
  Reply r{};
  ssize_t n = recv(fd, &r, sizeof(r), MSG_DONTWAIT | MSG_PEEK);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return std::nullopt;
  if (n == 0 || n < 0)
    throwComm(str("rank ", peer, " closed the connection before answering its hello (",
                  n == 0 ? "EOF" : std::strerror(errno), "): it exited or left the group"));
  if (n < static_cast<ssize_t>(sizeof(r))) return std::nullopt;
  (void)!recv(fd, &r, sizeof(r), MSG_DONTWAIT);
  if (r.magic != kReplyMagic || (r.status != static_cast<uint16_t>(HelloReply::Accepted) &&
                                 r.status != static_cast<uint16_t>(HelloReply::Superseded)))
    throwComm(str("rank ", peer, " answered a connection with garbage (mixed roce_pg versions across ranks?)"));
  return static_cast<HelloReply>(r.status);
}

UniqueFd dialRank(const TcpEndpoint& ep, LinkKind kind, int self, int peer, uint64_t selfNonce,
                  Clock::time_point deadline, const std::function<void()>& probe) {
  const sockaddr_in sa = addressOf(ep, peer);
  const std::string who = str("rank ", peer, " (", ep.host, ":", ep.port, ")");
  std::string lastErr;
  Clock::time_point nextProbe = Clock::now() + kProbeEvery;
  do {
    UniqueFd fd = newSocket();
    int err = connectOnce(fd.get(), sa, std::min(deadline, Clock::now() + kConnectAttempt));
    if (err == 0) {
      Hello h{kHelloMagic, kHelloVersion, static_cast<uint16_t>(kind), self, peer, selfNonce};
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

struct TcpAcceptor::Pending {
  int fd;
  std::string addr;
  Clock::time_point since;
  Hello hello{};
  size_t got = 0;
};

TcpAcceptor::TcpAcceptor(TcpListener& listener, int self, std::vector<uint64_t> nonces)
    : listener_(listener), self_(self), nonces_(std::move(nonces)) {}

TcpAcceptor::~TcpAcceptor() {
  for (auto& p : pending_) close(p.fd);
  for (auto& [key, fd] : ready_) close(fd);
}

void TcpAcceptor::acceptNew() {
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof(from);
    int fd = accept4(listener_.fd(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN: nothing more right now
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &from.sin_addr, buf, sizeof(buf));
    pending_.push_back({fd, str(buf, ":", ntohs(from.sin_port)), Clock::now()});
  }
}

void TcpAcceptor::readHellos() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    ssize_t r = recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got, MSG_DONTWAIT);
    if (r > 0) p.got += static_cast<size_t>(r);
    const bool gone = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    const bool stale = Clock::now() - p.since > kHelloDeadline;
    if (p.got < sizeof(Hello) && !gone && !stale) { ++i; continue; }
    const Hello& h = p.hello;
    const int src = h.src;
    const bool ours = p.got == sizeof(Hello) && h.magic == kHelloMagic && h.version == kHelloVersion &&
                      h.dst == self_ && src >= 0 && src < static_cast<int>(nonces_.size()) && src != self_ &&
                      h.nonce == nonces_[src] &&
                      (h.kind == static_cast<uint16_t>(LinkKind::Mesh) || h.kind == static_cast<uint16_t>(LinkKind::Lifeline)) &&
                      !ready_.count({h.kind, src});
    if (ours) {
      ready_[{h.kind, src}] = p.fd;
    } else {
      // Not a peer of this group incarnation (or a duplicate): drop it quietly.
      close(p.fd);
    }
    pending_.erase(pending_.begin() + static_cast<long>(i));
  }
}

void TcpAcceptor::service() {
  acceptNew();
  readHellos();
}

void TcpAcceptor::addPollFds(std::vector<pollfd>& fds) const {
  fds.push_back({listener_.fd(), POLLIN, 0});
  for (const auto& p : pending_) fds.push_back({p.fd, POLLIN, 0});
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
                       " to port ", listener_.port(), "; check that rank's log, firewalls between the machines, "
                       "or set ROCE_PG_SOCKET_IFNAME to an interface the peers can reach"));
    if (probe && Clock::now() >= nextProbe) {
      probe();
      nextProbe = Clock::now() + kProbeEvery;
    }
    std::vector<pollfd> fds{{listener_.fd(), POLLIN, 0}};
    for (auto& p : pending_) fds.push_back({p.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), static_cast<int>(std::min(left, 200LL)));
    acceptNew();
    readHellos();
  }
}

}  // namespace roce
