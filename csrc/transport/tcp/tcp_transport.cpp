#include "tcp_transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "../../common/backoff.hpp"
#include "../../common/config.hpp"
#include "../../common/error.hpp"

namespace roce {
namespace {

constexpr uint32_t kHelloMagic = 0x526f4345;  // "RoCE"

struct Hello {
  uint32_t magic;
  int32_t rank;
};

class TcpPipe : public BytePipe {
 public:
  TcpPipe(int fd, int peer, std::string addr) : fd_(fd), peer_(peer), addr_(std::move(addr)) {}
  ~TcpPipe() override { close(fd_); }

  size_t write(const iovec* iov, int n) override {
    msghdr m{};
    m.msg_iov = const_cast<iovec*>(iov);
    m.msg_iovlen = n;
    ssize_t r = sendmsg(fd_, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    throwComm(str("TCP send to rank ", peer_, " (", addr_, ") failed: ", std::strerror(errno),
                  "; that rank probably exited or destroyed the process group"));
  }

  size_t read(void* dst, size_t n) override {
    ssize_t r = recv(fd_, dst, n, MSG_DONTWAIT);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0)
      throwComm(str("rank ", peer_, " (", addr_, ") closed its TCP connection; it probably "
                    "exited or destroyed the process group"));
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    throwComm(str("TCP receive from rank ", peer_, " (", addr_, ") failed: ", std::strerror(errno)));
  }

 private:
  int fd_;
  int peer_;
  std::string addr_;
};

void setNonBlocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Blocking full transfer with a deadline, used only for the handshake.
void ioAll(int fd, void* buf, size_t n, bool writing, Clock::time_point deadline, const std::string& who) {
  char* p = static_cast<char*>(buf);
  while (n) {
    pollfd pfd{fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) throwTimeout(str("TCP handshake with ", who, " timed out"));
    if (poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
    ssize_t r = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (r <= 0) {
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      throwComm(str("TCP handshake with ", who, " failed: ", r == 0 ? "connection closed" : std::strerror(errno)));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

int dial(const TcpEndpoint& ep, int peer, Clock::time_point deadline) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(ep.port));
  if (inet_pton(AF_INET, ep.host.c_str(), &sa.sin_addr) != 1)
    throwInvalid(str("rank ", peer, " published an invalid address '", ep.host, "'"));
  std::string lastErr;
  do {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throwComm(str("socket() failed: ", std::strerror(errno)));
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) return fd;
    lastErr = std::strerror(errno);
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < deadline);
  throwComm(str("could not connect to rank ", peer, " at ", ep.host, ":", ep.port, ": ", lastErr,
                ". If the ranks are on different machines, check that this address is reachable "
                "and that no firewall blocks the port, or pick another interface with "
                "ROCE_PG_SOCKET_IFNAME"));
}

}  // namespace

TcpListener::TcpListener() {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throwComm(str("socket() failed: ", std::strerror(errno)));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(sa);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd_, 1024) != 0 ||
      getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    throwComm(str("could not open a TCP listening socket: ", std::strerror(errno)));
  port_ = ntohs(sa.sin_port);
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) close(fd_);
}

std::string tcpAdvertiseAddress(const Config& cfg) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "127.0.0.1";
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
  return chosen.empty() ? "127.0.0.1" : chosen;
}

static std::vector<std::unique_ptr<BytePipe>> connectMesh(int rank, TcpListener& listener,
                                                          const std::vector<TcpEndpoint>& eps,
                                                          const std::vector<bool>& serve,
                                                          std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const int size = static_cast<int>(eps.size());
  std::vector<std::unique_ptr<BytePipe>> pipes(size);
  // Dial every higher peer first: the kernel completes those handshakes from
  // the peers' listen backlogs, so nobody waits on anybody's accept order.
  for (int peer = rank + 1; peer < size; ++peer) {
    if (!serve[peer]) continue;
    int fd = dial(eps[peer], peer, deadline);
    std::string who = str("rank ", peer, " (", eps[peer].host, ":", eps[peer].port, ")");
    Hello h{kHelloMagic, rank};
    ioAll(fd, &h, sizeof(h), true, deadline, who);
    tune(fd);
    setNonBlocking(fd, true);
    pipes[peer] = std::make_unique<TcpPipe>(fd, peer, str(eps[peer].host, ":", eps[peer].port));
  }
  int expected = 0;
  for (int peer = 0; peer < rank; ++peer) expected += serve[peer];
  while (expected > 0) {
    pollfd pfd{listener.fd(), POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    std::string missing;
    for (int peer = 0; peer < rank; ++peer)
      if (serve[peer] && !pipes[peer]) missing += str(missing.empty() ? "" : ", ", peer);
    if (left <= 0)
      throwTimeout(str("rank ", rank, " timed out waiting for TCP connections from rank(s) ", missing,
                       " to port ", listener.port(), "; check firewalls between the machines or "
                       "set ROCE_PG_SOCKET_IFNAME to an interface the peers can reach"));
    if (poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000))) <= 0) continue;
    sockaddr_in from{};
    socklen_t len = sizeof(from);
    int fd = accept4(listener.fd(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &from.sin_addr, buf, sizeof(buf));
    Hello h{};
    ioAll(fd, &h, sizeof(h), false, deadline, str("a peer at ", buf));
    if (h.magic != kHelloMagic || h.rank < 0 || h.rank >= rank || !serve[h.rank] || pipes[h.rank]) {
      close(fd);  // not one of ours (stray connection): ignore it
      continue;
    }
    tune(fd);
    setNonBlocking(fd, true);
    pipes[h.rank] = std::make_unique<TcpPipe>(fd, h.rank, str(buf, ":", ntohs(from.sin_port)));
    --expected;
  }
  return pipes;
}

TcpTransport::TcpTransport(int rank, TcpListener& listener, const std::vector<TcpEndpoint>& endpoints,
                           const std::vector<bool>& serve, std::chrono::milliseconds timeout)
    : StreamTransport(rank, connectMesh(rank, listener, endpoints, serve, timeout)) {}

}  // namespace roce
