#include "shm_doorbells.hpp"

#include <cstdint>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "../../common/config.hpp"
#include "../../common/log.hpp"
#include "../../common/wakeup.hpp"
#include "doorbell.hpp"

namespace roce::transport::shm {

ShmDoorbells::~ShmDoorbells() {
  const int fd = fd_.load();
  if (fd >= 0) close(fd);
}

bool ShmDoorbells::open() {
  if (fd_.load() >= 0) return true;
  // ROCE_PG_TEST_FAULT=no_doorbell: what a process that cannot open one does
  // (poll). Any other failure is tried again by the next group (it may have
  // been a passing shortage of descriptors).
  if (testFault() == "no_doorbell") return false;
  // Blocking, for sends (bounded by SO_SNDTIMEO); reads never block (MSG_DONTWAIT).
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ROCE_WARN("no shared-memory doorbell (socket: ", std::strerror(errno), "): waits on shared memory will poll");
    return false;
  }
  // Autobind: an address length of just the family picks a free abstract name.
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  socklen_t len = sizeof(a);
  const timeval sendTimeout{0, static_cast<suseconds_t>(std::chrono::microseconds(kSendTimeout).count())};
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(sa_family_t)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || len <= sizeof(sa_family_t) ||
      len > sizeof(a) || setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &sendTimeout, sizeof(sendTimeout)) != 0) {
    ROCE_WARN("no shared-memory doorbell (", std::strerror(errno), "): waits on shared memory will poll");
    close(fd);
    return false;
  }
  addr_ = a;
  addrLen_ = len;
  fd_.store(fd);
  rt_.poke();  // the runtime thread polls it from its next round on
  return true;
}

uint64_t ShmDoorbells::enrol(ShmBellControl* ctl) {
  std::lock_guard<std::mutex> g(mu_);
  if (!open()) return 0;
  const uint64_t key = nextKey_++;
  wakeups_.emplace(key, nullptr);
  ctl->key = key;
  std::memcpy(ctl->addr, &addr_, addrLen_);
  ctl->addrLen = addrLen_;
  return key;
}

void ShmDoorbells::wakeThrough(uint64_t key, Wakeup* w) {
  std::lock_guard<std::mutex> g(mu_);  // polled() forwards under it
  auto it = wakeups_.find(key);
  if (it != wakeups_.end()) it->second = w;
}

void ShmDoorbells::leave(uint64_t key) {
  std::lock_guard<std::mutex> g(mu_);
  wakeups_.erase(key);
}

size_t ShmDoorbells::groups() const {
  std::lock_guard<std::mutex> g(mu_);
  return wakeups_.size();
}

int ShmDoorbells::send(const sockaddr_un& to, socklen_t len, uint64_t key) {
  const int fd = fd_.load(std::memory_order_relaxed);
  if (fd < 0) return EBADF;
  // A signal interrupts a send blocked on a full queue even with SA_RESTART
  // (SO_SNDTIMEO): try again a few times, then give up this wake-up as on a
  // timeout.
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (sendto(fd, &key, sizeof(key), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&to), len) ==
        static_cast<ssize_t>(sizeof(key)))
      return 0;
    if (errno != EINTR) return errno == EWOULDBLOCK ? EAGAIN : errno;
  }
  return EAGAIN;
}

void ShmDoorbells::addPollFds(std::vector<pollfd>& fds) {
  const int fd = fd_.load(std::memory_order_relaxed);
  if (fd >= 0) fds.push_back(pollfd{fd, POLLIN, 0});
}

void ShmDoorbells::polled(const pollfd* fds, size_t n) {
  if (n == 0 || !(fds[0].revents & POLLIN)) return;
  uint64_t keys[64];
  int taken = 0;
  std::lock_guard<std::mutex> g(mu_);
  // Each datagram is one key; a full round drains the queue, a stranger's
  // (any local process may send to an abstract address) names no key.
  uint64_t key = 0;
  while (taken < 64 && recv(fds[0].fd, &key, sizeof(key), MSG_DONTWAIT) == static_cast<ssize_t>(sizeof(key)))
    keys[taken++] = key;
  for (int i = 0; i < taken; ++i) {
    auto it = wakeups_.find(keys[i]);
    if (it != wakeups_.end() && it->second) it->second->wake();
  }
  if (taken == 64) rt_.poke();  // more may be queued: another round at once
}

}  // namespace roce::transport::shm
