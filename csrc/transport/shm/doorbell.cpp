#include "doorbell.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "../../common/config.hpp"
#include "../../common/log.hpp"

namespace roce {

Doorbell::Doorbell(ShmBellControl* mine) : mine_(mine) {
  // ROCE_PG_TEST_FAULT=no_doorbell: what a rank that cannot open one does (poll).
  if (testFault() == "no_doorbell") return;
  fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  // Autobind: an address length of just the family picks a free abstract name.
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  socklen_t len = sizeof(a);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(sa_family_t)) != 0 ||
      getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0 || len <= sizeof(sa_family_t) ||
      len > sizeof(a)) {
    ROCE_WARN("no shared-memory doorbell (", std::strerror(errno), "): waits on shared memory will poll");
    close(fd_);
    fd_ = -1;
    return;
  }
  std::memcpy(mine_->addr, &a, len);
  mine_->addrLen = len;
}

Doorbell::~Doorbell() {
  if (fd_ >= 0) close(fd_);
}

void Doorbell::withdraw() {
  mine_->sleeping.store(0, std::memory_order_relaxed);
  char c[8];
  while (recv(fd_, c, sizeof(c), MSG_DONTWAIT) >= 0) {
  }
}

void Doorbell::send(Peer& peer) {
  if (peer.len == 0) {
    // Written by the peer before it published its segment, which this rank
    // mapped after reading the name from the store. Bounded before use.
    const uint32_t len = peer.ctl->addrLen;
    if (len > sizeof(sa_family_t) && len <= sizeof(peer.addr)) {
      std::memcpy(&peer.addr, peer.ctl->addr, len);
      peer.addr.sun_family = AF_UNIX;
      peer.len = len;
    }
  }
  if (fd_ >= 0 && peer.len > 0) {
    const char c = 0;
    if (sendto(fd_, &c, 1, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&peer.addr), peer.len) == 1)
      return;
    // A full queue is readable already; a closed doorbell belongs to a rank
    // that left the group (its lifeline tells).
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNREFUSED) return;
  }
  if (!peer.ctl->broken.exchange(1, std::memory_order_relaxed))
    ROCE_WARN("could not ring a local peer's shared-memory doorbell (",
              fd_ < 0 || peer.len == 0 ? "no doorbell" : std::strerror(errno), "): its waits will poll");
}

}  // namespace roce
