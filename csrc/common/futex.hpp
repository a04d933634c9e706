// Blocking on a 32-bit word in shared memory, across processes. The futex
// calls carry no FUTEX_PRIVATE_FLAG: the kernel keys a shared futex by the
// physical page, so two processes that map the same segment at different
// addresses wait and wake on the same word (futex(2)).
#pragma once
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "backoff.hpp"

namespace roce {

// Sleeps while *word == expected, at most `ns` nanoseconds (spurious and early
// returns are normal: callers re-check their condition).
inline void futexWait(std::atomic<uint32_t>* word, uint32_t expected, long ns) {
  timespec ts = toTimespec(std::chrono::nanoseconds(ns));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futexWake(std::atomic<uint32_t>* word, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

// A wake-up channel in shared memory: the publisher of some state calls
// notify() after its (seq_cst) store; a waiter that found the state not yet
// there calls sleep(). The `sleepers` count makes notify() a plain load when
// nobody sleeps, so the fast path has no system call; the seq_cst order of
// "sleepers++ then re-check the state" against "store the state then read
// sleepers" guarantees that one of the two sides sees the other (no lost wake).
struct alignas(64) ShmWakeup {
  std::atomic<uint32_t> word{0};      // bumped on every notify that may wake someone
  std::atomic<uint32_t> sleepers{0};  // waiters inside sleep()

  // `count`: wake at most this many sleepers (a worker pool wakes only as
  // many threads as a job has parts for); the others sleep on until their
  // timeout or a later notify.
  void notify(int count = INT_MAX) {
    if (count <= 0 || sleepers.load(std::memory_order_seq_cst) == 0) return;
    word.fetch_add(1, std::memory_order_seq_cst);
    futexWake(&word, count);
  }
  // Blocks for at most `ns` unless ready() already holds; returns ready().
  template <class Ready>
  bool sleep(Ready&& ready, long ns) {
    const uint32_t seen = word.load(std::memory_order_seq_cst);
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    bool ok = ready();
    if (!ok) {
      futexWait(&word, seen, ns);
      ok = ready();
    }
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    return ok;
  }
};

}  // namespace roce
