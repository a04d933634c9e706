// Waiting without burning a core that another rank needs: spin briefly (lowest
// latency when every rank has a core), then yield, then sleep with a growing
// interval capped at 1 ms (ranks often outnumber cores). This is the fallback
// for waits with nothing to block on (shared-memory rings with pending work
// when the rank has no usable doorbell, transport/shm/doorbell.hpp); network
// and ring waits block in poll (Communicator::blockUntilActivity) and the
// shared-memory allreduce barrier on a futex (spin.hpp, futex.hpp).
#pragma once
#include <sched.h>
#include <time.h>

#include <chrono>
#include <cstdint>

namespace roce {

using Clock = std::chrono::steady_clock;

// Milliseconds until `deadline` (negative once it passed), for poll timeouts.
inline long long msLeft(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

// For the timed system calls (nanosleep, futex, ppoll).
inline timespec toTimespec(std::chrono::nanoseconds d) {
  const long long ns = d.count() < 0 ? 0 : d.count();
  return timespec{static_cast<time_t>(ns / 1000000000LL), static_cast<long>(ns % 1000000000LL)};
}

class Backoff {
 public:
  void reset() { idle_ = 0; }
  // For a wait that has already spun its budget elsewhere: continue with the
  // yields (which hand the core to the peer being waited for when ranks
  // outnumber cores), not with another 2000 spins.
  void skipSpins() {
    if (idle_ < kSpins) idle_ = kSpins;
  }
  void pause() {
    ++idle_;
    if (idle_ < kSpins) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield" ::: "memory");
#endif
    } else if (idle_ < kSpins + kYields) {
      sched_yield();
    } else {
      uint64_t extra = idle_ - kSpins - kYields;
      long ns = extra < 100 ? 20000 : (extra < 1000 ? 200000 : 1000000);
      timespec ts{0, ns};
      nanosleep(&ts, nullptr);
    }
  }
  // True once waiting has become slow enough that occasional expensive checks are cheap.
  bool sleeping() const { return idle_ >= kSpins + kYields; }

 private:
  static constexpr uint64_t kSpins = 2000;
  static constexpr uint64_t kYields = 2000;
  uint64_t idle_ = 0;
};

}  // namespace roce
