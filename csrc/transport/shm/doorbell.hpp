// The shared-memory doorbell, so that a wait on shared-memory rings blocks in
// ppoll together with the rank's sockets and its group's Wakeup eventfd
// instead of polling. The Wakeup protocol (common/wakeup.hpp) across
// processes:
//
//   waiter (the ring's owner, progress thread)    waker (a local peer that moved a ring)
//   group Wakeup announced, then                  store head / tail (the ring moved)
//   announce: sleeping = 1; seq_cst fence         seq_cst fence
//   re-check every ring (Communicator::           if sleeping && sleeping.exchange(0):
//     blockUntilActivity runs progress())           sendto(the waiter's process doorbell,
//   ppoll(sockets, group Wakeup eventfd)                   the waiter's group key)
//   withdraw: sleeping = 0                        the waiter's runtime thread: wake the
//                                                   group's Wakeup (ShmDoorbells)
//
// Why no wake-up is lost: the two seq_cst fences order "sleeping = 1" before
// the waiter's reads of the ring indices and the waker's index store before
// its read of `sleeping`, so (store-buffering with fences) either the waker
// reads sleeping == 1 or the waiter's re-check reads the new index and does
// not sleep. A waker that reads 1 rings unless its exchange returns 0; then
// another waker's exchange took the 1 and rings this same sleep, or the
// waiter withdrew (its sleep is over), and the waker's read of `sleeping` was
// coherence-ordered before the waiter's next announce, so that announce's
// re-check sees the waker's index. The group's Wakeup was announced before
// `sleeping` was released and the exchange acquires it, so the runtime
// thread that takes the datagram finds the announcement and writes the
// eventfd; it stays readable until the group's last waiter withdraws, so a
// ring that lands between the re-check and ppoll still wakes it. The
// exchange lets at most one datagram per group per sleep be queued.
//
// Descriptors: the datagram socket is one per process, not one per group, so
// a process's descriptors do not grow with its groups (ShmDoorbells, read by
// the runtime thread); a group's doorbell is a
// key in it. A group's control page (node_shm.hpp) holds its process's
// address and its key; a peer sends from its own process's socket and reads
// the address the first time it rings. A peer that cannot send (no socket,
// or sendto fails with anything but a full queue or a closed doorbell) marks
// the doorbell broken, and its owner then polls its rings instead of
// waiting to be rung (StreamTransport::prepareWait); a blocked wait sleeps
// at most until the next slow check (200 ms), so a wake-up lost that way costs that much once,
// never a hang.
#pragma once
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <cstdint>

namespace roce {
class Wakeup;
}
namespace roce::transport::shm {

class ShmDoorbells;

// In each rank's control page (node_shm.hpp).
struct alignas(64) ShmBellControl {
  std::atomic<uint32_t> sleeping{0};  // the owner announced that it blocks
  std::atomic<uint32_t> broken{0};    // a peer failed to ring it: the owner must poll
  uint64_t key = 0;                   // the group's key in its process's doorbell
  uint32_t addrLen = 0;               // bytes of addr; 0: the process has no doorbell
  char addr[sizeof(sockaddr_un)] = {};
};

// One group's doorbell: its key in the process's doorbell (ShmDoorbells), the
// announce flag peers read, and the ringing of peers' doorbells.
class Doorbell {
 public:
  explicit Doorbell(ShmBellControl* mine);  // enrolls and publishes address and key in `mine`
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // The group's Wakeup, which a ring wakes from now on (null: none; a ring
  // then wakes nobody). It must outlive the doorbell or be unset first.
  void wakeThrough(Wakeup* w);
  // A wait may block on the group's Wakeup: the process has a doorbell and no
  // peer failed to ring this one.
  bool usable() const { return key_ != 0 && !mine_->broken.load(std::memory_order_relaxed); }
  void announce() {
    mine_->sleeping.store(1, std::memory_order_release);  // after the group Wakeup's announcement
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  void withdraw() { mine_->sleeping.store(0, std::memory_order_relaxed); }

  // A peer's doorbell, its address read the first time it is rung.
  struct Peer {
    ShmBellControl* ctl = nullptr;
    sockaddr_un addr{};
    socklen_t len = 0;  // 0: not read yet
    uint64_t key = 0;
  };
  // After this rank moved a ring it shares with `peer` (wrote data into it or
  // freed space in it): one fence and one load unless the peer sleeps.
  void ring(Peer& peer) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!peer.ctl->sleeping.load(std::memory_order_relaxed)) return;
    if (!peer.ctl->sleeping.exchange(0, std::memory_order_acq_rel)) return;
    send(peer);
  }

 private:
  void send(Peer& peer);
  ShmDoorbells& doorbells_;  // the process's (its runtime's), looked up once
  // The process that enrolled: a forked child that destroys an inherited
  // group leaves the parent's doorbell alone (its lock may have been held
  // by a parent thread at the fork; the child's copy is never served).
  const pid_t owner_;
  uint64_t key_ = 0;         // 0: the process has no doorbell
  ShmBellControl* mine_;
};

}  // namespace roce::transport::shm
