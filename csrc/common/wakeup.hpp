// Lets another thread interrupt the progress thread while it blocks in poll()
// (Communicator::blockUntilActivity): work was queued, an abort was requested,
// a lifeline reported a dead peer. The waiter announces that it is about to
// block, re-checks its conditions, then sleeps; a waker writes the eventfd
// only while such an announcement stands, so the common case (the progress
// thread busy) costs one atomic load and no system call.
#pragma once
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

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
  // block. The fences pair with wake()'s: either the waker sees the
  // announcement and writes, or the waiter's re-check sees the condition.
  void announce() {
    blocking_.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  void withdraw() {
    blocking_.store(false, std::memory_order_relaxed);
    uint64_t v;
    if (read(fd_, &v, sizeof(v)) < 0) { /* EAGAIN: nobody wrote */ }
  }
  // Waker: call after setting the condition.
  void wake() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!blocking_.load(std::memory_order_relaxed)) return;
    uint64_t one = 1;
    if (write(fd_, &one, sizeof(one)) < 0) { /* EAGAIN: the counter is already non-zero */ }
  }

 private:
  int fd_;
  std::atomic<bool> blocking_{false};
};

}  // namespace roce
