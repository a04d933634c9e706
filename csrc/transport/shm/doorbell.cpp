#include "doorbell.hpp"

#include <cstdint>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "../../common/log.hpp"
#include "shm_doorbells.hpp"

namespace roce::transport::shm {

Doorbell::Doorbell(ShmBellControl* mine)
    : doorbells_(ProcessRuntime::get().service<ShmDoorbells>()), owner_(getpid()), key_(doorbells_.enrol(mine)), mine_(mine) {}

Doorbell::~Doorbell() {
  if (key_ && getpid() == owner_) doorbells_.leave(key_);
}

void Doorbell::wakeThrough(Wakeup* w) {
  if (key_ && getpid() == owner_) doorbells_.wakeThrough(key_, w);
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
      peer.key = peer.ctl->key;
    }
  }
  int err = EBADF;  // no doorbell here, or none there
  if (key_ && peer.len > 0) {
    err = doorbells_.send(peer.addr, peer.len, peer.key);
    // A queue still full after the send timeout costs this sleep its
    // wake-up (the waiter's slow check makes up for it); a closed doorbell
    // belongs to a process that left (its lifelines tell).
    if (err == 0 || err == EAGAIN || err == ECONNREFUSED) return;
  }
  if (!peer.ctl->broken.exchange(1, std::memory_order_relaxed))
    ROCE_WARN("could not ring a local peer's shared-memory doorbell (",
              err == EBADF ? "no doorbell" : std::strerror(err), "): its waits will poll");
}

}  // namespace roce::transport::shm
