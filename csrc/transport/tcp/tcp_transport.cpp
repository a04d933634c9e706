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
#include "../../common/sockets.hpp"

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

TcpTransport::TcpTransport(int rank, int size, const std::vector<std::string>& hostNames)
    : StreamTransport(rank, std::vector<std::unique_ptr<BytePipe>>(size)), hostNames_(hostNames) {}

void TcpTransport::adoptConnection(int peer, int fd) {
  setNonBlocking(fd, true);
  // "host hostname, a.b.c.d:port": errors name the machine as operators know it.
  std::string addr = str("host ", hostNames_.at(peer), ", ", peerAddress(fd));
  addPipe(peer, std::make_unique<TcpPipe>(fd, peer, std::move(addr)));
}

}  // namespace roce
