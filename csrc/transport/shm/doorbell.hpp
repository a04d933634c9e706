// A doorbell per rank of a machine's group, so that a wait on shared-memory
// rings blocks in ppoll together with the rank's sockets (and its Wakeup
// eventfd) instead of polling. The Wakeup protocol (common/wakeup.hpp) across
// processes:
//
//   waiter (the ring's owner, progress thread)    waker (a local peer that moved a ring)
//   announce: sleeping = 1; seq_cst fence         store head / tail (the ring moved)
//   re-check every ring (Communicator::           seq_cst fence
//     blockUntilActivity runs progress())         if sleeping && sleeping.exchange(0):
//   ppoll(doorbell socket, sockets, eventfd)        sendto(the waiter's doorbell)
//   withdraw: sleeping = 0; drain the socket
//
// Why no wake-up is lost: the two seq_cst fences order "sleeping = 1" before
// the waiter's reads of the ring indices and the waker's index store before
// its read of `sleeping`, so (store-buffering with fences) either the waker
// reads sleeping == 1 or the waiter's re-check reads the new index and does
// not sleep. A waker that reads 1 rings unless its exchange returns 0; then
// another waker's exchange took the 1 and rings this same sleep, or the
// waiter withdrew (its sleep is over), and the waker's read of `sleeping` was
// coherence-ordered before the waiter's next announce, so that announce's
// re-check sees the waker's index. The datagram stays queued until withdraw
// drains it (level-triggered), so a ring that lands between the re-check and
// ppoll still wakes it; one that lands after the drain only makes the next
// sleep return at once. The exchange lets at most one datagram per sleep be
// queued, so a doorbell's queue cannot fill up and a sender's socket buffer
// cannot run out on doorbells of peers that do not drain.
//
// The doorbell is a Unix datagram socket autobound to an abstract address
// (Linux: a NUL and 5 hex digits, unique in the network namespace, gone when
// the process closes it; ranks of one machine share a namespace: their
// lifelines use 127.0.0.1). Its address lives in the rank's control page in
// shared memory; a peer sends from its own doorbell socket, so a rank holds
// one descriptor whatever the number of peers, and reads a peer's address the
// first time it rings it. A peer that cannot send (no socket, or sendto fails
// with anything but a full queue or a closed doorbell) marks the doorbell
// broken, and its owner then polls as before (StreamTransport::prepareWait);
// a blocked wait sleeps at most until the next slow check (200 ms), so a
// wake-up lost that way costs that much once, never a hang.
#pragma once
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <cstdint>

namespace roce {

// In each rank's control page (node_shm.hpp).
struct alignas(64) ShmBellControl {
  std::atomic<uint32_t> sleeping{0};  // the owner announced that it blocks
  std::atomic<uint32_t> broken{0};    // a peer failed to ring it: the owner must poll
  uint32_t addrLen = 0;               // bytes of addr; 0: this rank has no doorbell
  char addr[sizeof(sockaddr_un)] = {};
};

// The owner's side, and the socket it rings its peers' doorbells from.
class Doorbell {
 public:
  explicit Doorbell(ShmBellControl* mine);  // opens the socket and publishes its address in `mine`
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // A wait may block on fd(): the socket exists and no peer failed to ring it.
  bool usable() const { return fd_ >= 0 && !mine_->broken.load(std::memory_order_relaxed); }
  int fd() const { return fd_; }
  void announce() {
    mine_->sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  void withdraw();

  // A peer's doorbell, its address read the first time it is rung.
  struct Peer {
    ShmBellControl* ctl = nullptr;
    sockaddr_un addr{};
    socklen_t len = 0;  // 0: not read yet
  };
  // After this rank moved a ring it shares with `peer` (wrote data into it or
  // freed space in it): one fence and one load unless the peer sleeps.
  void ring(Peer& peer) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!peer.ctl->sleeping.load(std::memory_order_relaxed)) return;
    if (!peer.ctl->sleeping.exchange(0, std::memory_order_relaxed)) return;
    send(peer);
  }

 private:
  void send(Peer& peer);
  int fd_ = -1;
  ShmBellControl* mine_;
};

}  // namespace roce
