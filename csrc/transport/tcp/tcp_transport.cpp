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
                  "; that rank died (crash, OOM killer, SIGKILL: see its log) or destroyed the process group"));
  }

  size_t read(void* dst, size_t n) override {
    ssize_t r = recv(fd_, dst, n, MSG_DONTWAIT);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0)
      throwComm(str("rank ", peer_, " (", addr_, ") closed its TCP connection: it died (crash, OOM killer, "
                    "SIGKILL: see its log) or destroyed the process group"));
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    throwComm(str("TCP receive from rank ", peer_, " (", addr_, ") failed: ", std::strerror(errno)));
  }

  int pollFd() const override { return fd_; }

 private:
  int fd_;
  int peer_;
  std::string addr_;
};

}  // namespace

TcpListener::TcpListener() {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throwComm(str("socket() failed: ", std::strerror(errno)));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(sa);
  setNonBlocking(fd_, true);  // TcpAcceptor drains it with accept4 until EAGAIN
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

TcpTransport::TcpTransport(int rank, int size, const std::vector<std::string>& hostNames)
    : StreamTransport(rank, std::vector<std::unique_ptr<BytePipe>>(size)), hostNames_(hostNames) {}

void TcpTransport::adoptConnection(int peer, int fd) {
  setNonBlocking(fd, true);
  // "host hostname, a.b.c.d:port": errors name the machine as operators know it.
  std::string addr = str("host ", hostNames_.at(peer), ", ", peerAddress(fd));
  addPipe(peer, std::make_unique<TcpPipe>(fd, peer, std::move(addr)));
}

}  // namespace roce
