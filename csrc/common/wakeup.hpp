// Lets another thread interrupt a thread of the group that blocks in poll():
// the caller's thread in an operation (Communicator::blockUntilActivity) and
// the engine's thread idle between operations (waitIdle) — both may block at
// once, on this one eventfd (one descriptor per group, not one per waiting
// thread: a process holds many groups). Wakers set
// their condition (work was queued, an abort was requested, a lifeline
// reported a dead peer, a connection arrived), then call wake(). A waiter
// announces that it is about to block, re-checks its conditions, then
// sleeps; a waker writes the eventfd only while some announcement stands, so
// the common case (nobody blocked) costs one atomic load and no system call.
// Every waiter wakes on every write and re-checks its own conditions.
//
// Clearing: a waiter that withdraws while another is still announced leaves
// the counter set, or it would swallow a write meant for the other, which
// may not have reached poll() yet; the last one to withdraw clears it. The
// count and the clear share a lock, so a clear never lands after a later
// waiter's announcement (whose write would then be lost). The price: a
// waiter that re-announces before the other withdrew finds the counter
// still set and polls once more — until that other thread, already woken,
// withdraws.
#pragma once
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>

namespace roce {

class Wakeup {
 public:
  Wakeup() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~Wakeup() {
    if (fd_ >= 0) close(fd_);
  }
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  // Waiter: announce, then re-check every condition a waker may have set, then
  // block, then withdraw. The fences pair with wake()'s: either the waker
  // sees the announcement and writes, or the waiter's re-check sees the
  // condition.
  void announce() {
    {
      std::lock_guard<std::mutex> g(mu_);
      waiters_.fetch_add(1, std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  void withdraw() {
    std::lock_guard<std::mutex> g(mu_);
    if (waiters_.fetch_sub(1, std::memory_order_relaxed) != 1) return;  // another still waits: keep the write
    uint64_t v;
    if (read(fd_, &v, sizeof(v)) < 0) { /* EAGAIN: nobody wrote */ }
  }
  // announce() now, withdraw() at the latest when it goes (a throw between
  // the two must not leave the announcement standing).
  class Announcement {
   public:
    explicit Announcement(Wakeup& w) : w_(&w) { w.announce(); }
    ~Announcement() { withdraw(); }
    Announcement(const Announcement&) = delete;
    Announcement& operator=(const Announcement&) = delete;
    void withdraw() {
      if (w_) std::exchange(w_, nullptr)->withdraw();
    }

   private:
    Wakeup* w_;
  };
  // Waker: call after setting the condition.
  void wake() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_relaxed) == 0) return;
    uint64_t one = 1;
    if (write(fd_, &one, sizeof(one)) < 0) { /* EAGAIN: the counter is already non-zero */ }
  }

 private:
  int fd_;
  std::mutex mu_;                 // orders announcements against the last waiter's clear
  std::atomic<int> waiters_{0};   // announced and not yet withdrawn
};

}  // namespace roce
