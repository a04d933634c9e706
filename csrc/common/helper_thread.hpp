// A thread that runs one job at a time for the progress thread: the
// reductions of a collective's channels beyond the first
// (ROCE_PG_NCHANNELS), so that several cores reduce while the progress
// thread alone drives the transports (which therefore still need no locks).
//
// The progress thread submits a job only while the helper is idle and polls
// idle() from its wait loop; the helper calls `onDone` after each job so the
// waiter can be woken (Communicator::helperFinished). Between jobs the helper
// spins for ROCE_PG_SPIN_US, then sleeps on a futex: an idle group costs no
// CPU, and ranks outnumbering cores lose nothing to it.
#pragma once
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "futex.hpp"
#include "spin.hpp"

namespace roce {

class HelperThread {
 public:
  using Fn = void (*)(void* arg);

  HelperThread(int spinUs, std::function<void()> onDone)
      : spin_(std::chrono::microseconds(spinUs)), onDone_(std::move(onDone)), thread_([this] { loop(); }) {}

  ~HelperThread() {
    waitIdle();
    stop_.store(true, std::memory_order_seq_cst);
    jobs_.notify();
    thread_.join();
  }
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  // Progress thread only, and only while idle(): runs fn(arg) on the helper.
  // `arg` must stay valid until idle() is true again.
  void submit(Fn fn, void* arg) {
    fn_ = fn;
    arg_ = arg;
    submitted_.store(submitted_.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
    jobs_.notify();
  }
  // True when every submitted job has finished (its writes are visible).
  bool idle() const {
    return finished_.load(std::memory_order_acquire) == submitted_.load(std::memory_order_relaxed);
  }
  // Blocks until the running job (if any) has finished: an unwinding
  // operation must not free memory a helper still writes.
  void waitIdle() {
    // seq_cst: ShmWakeup's "announce a sleeper, then re-check" needs the
    // re-check ordered after the announcement (see futex.hpp).
    auto ready = [this] {
      return finished_.load(std::memory_order_seq_cst) == submitted_.load(std::memory_order_relaxed);
    };
    if (spinFor(ready, spin_)) return;
    while (!finishedWake_.sleep(ready, 1000000)) {
    }
  }

 private:
  void loop() {
    pthread_setname_np(pthread_self(), "roce-reduce");  // visible in top -H, py-spy, /proc/<pid>/task
    uint32_t seen = 0;
    auto ready = [&] {  // seq_cst, as in waitIdle()
      return submitted_.load(std::memory_order_seq_cst) != seen || stop_.load(std::memory_order_seq_cst);
    };
    for (;;) {
      if (!spinFor(ready, spin_))
        while (!jobs_.sleep(ready, 100000000)) {
        }
      if (submitted_.load(std::memory_order_acquire) == seen) return;  // stop_, nothing left to run
      seen = submitted_.load(std::memory_order_acquire);
      fn_(arg_);
      finished_.store(seen, std::memory_order_seq_cst);
      finishedWake_.notify();
      onDone_();
    }
  }

  const std::chrono::nanoseconds spin_;
  const std::function<void()> onDone_;
  Fn fn_ = nullptr;  // written by submit() before the release of submitted_
  void* arg_ = nullptr;
  std::atomic<uint32_t> submitted_{0}, finished_{0};
  std::atomic<bool> stop_{false};
  ShmWakeup jobs_, finishedWake_;  // futex words (process-local use works the same)
  std::thread thread_;             // last: starts after everything above exists
};

}  // namespace roce
