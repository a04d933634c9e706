#include "sockets.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "error.hpp"

namespace roce {

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

namespace {
// The remote end's IPv4 address and port; false if the socket has none.
bool remoteEnd(int fd, std::string& ip, int& port) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  char buf[INET_ADDRSTRLEN];
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 || sa.sin_family != AF_INET ||
      !inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof(buf)))
    return false;
  ip = buf;
  port = ntohs(sa.sin_port);
  return true;
}
}  // namespace

std::string peerAddress(int fd) {
  std::string ip;
  int port = 0;
  return remoteEnd(fd, ip, port) ? str(ip, ":", port) : std::string("?");
}

std::string peerIp(int fd) {
  std::string ip;
  int port = 0;
  return remoteEnd(fd, ip, port) ? ip : std::string("?");
}

}  // namespace roce
