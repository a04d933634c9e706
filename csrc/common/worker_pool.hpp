// The per-process worker pool: threads that take slices of a rank's local
// copies and reductions (the shared-memory collectives, algorithms/shm_*.cpp,
// and the network algorithms' reductions), so a rank uses more than its progress thread's core.
//
// One pool per process, shared by every group: a job is split into parts that
// the submitting thread and the pool's threads claim one at a time from a
// shared counter, so the caller always works too, and a job still finishes
// (on the caller alone) when the workers are descheduled, which is the normal
// case when ranks outnumber cores. Which thread runs a part never changes what
// the part computes: callers cut their work into element ranges, and every
// element is computed the same way whoever computes it, so results are the
// same bits for any worker count (ROCE_PG_WORKERS is a per-rank setting that
// peers never see).
//
// One job at a time: a submitter that finds the pool busy (another group's
// progress thread, or a user thread running an op inline) runs its parts
// itself instead of queueing. Idle workers spin ROCE_PG_SPIN_US, then sleep on
// a futex: an idle pool costs no CPU.
//
// Threads are created when a group needs them (WorkerPool::process().
// ensureThreads at group creation) and inherit the creating thread's CPU
// affinity; they live until the process exits (the pool is never destroyed,
// so no thread can outlive what it touches). A forked child starts with a
// new, empty pool (its jobs run on the caller until it creates a group).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <type_traits>

#include "futex.hpp"

namespace roce {

class WorkerPool {
 public:
  // Runs part `part` of a job. Must not throw: a part runs on a thread that
  // has no one to hand an exception to.
  using PartFn = void (*)(void* ctx, size_t part) noexcept;

  static WorkerPool& process();

  // Makes the pool hold at least `threads` threads (never shrinks). `spinUs`:
  // how long an idle thread, or a caller waiting for the threads, spins
  // before it sleeps (the smallest value any caller asked for).
  void ensureThreads(int threads, int spinUs);
  int threads() const { return threads_.load(std::memory_order_relaxed); }

  // Runs fn(ctx, i) for every i in [0, parts), the caller included; returns
  // once all have finished (their writes visible to the caller). Returns how
  // many parts the pool's threads ran (the rest ran on the caller).
  size_t run(size_t parts, PartFn fn, void* ctx);

  // Splits [0, n) into at most `parts` ranges of about `minLen` or more, with
  // inner boundaries on multiples of `align`, and runs body(lo, hi) on each.
  // Returns how many ranges the pool's threads ran. An exception from a range
  // is rethrown here, once every range has finished.
  template <class Body>
  size_t forRanges(size_t n, size_t align, size_t minLen, int parts, Body&& body) {
    size_t p = std::max<size_t>(1, n / std::max<size_t>(1, minLen));
    if (parts < 1) parts = 1;
    if (p > static_cast<size_t>(parts)) p = static_cast<size_t>(parts);
    if (p <= 1 || threads() == 0) {
      body(size_t(0), n);
      return 0;
    }
    struct Job {
      std::remove_reference_t<Body>* body;
      size_t n, align, parts;
      std::atomic<bool> failed{false};
      std::exception_ptr error;  // the first range's exception, written by whoever set `failed`
      size_t bound(size_t i) const { return i == parts ? n : n * i / parts / align * align; }
    } job{&body, n, std::max<size_t>(1, align), p};
    const size_t ran = run(p, [](void* ctx, size_t i) noexcept {
      Job& j = *static_cast<Job*>(ctx);
      const size_t lo = j.bound(i), hi = j.bound(i + 1);
      if (lo >= hi) return;
      try {
        (*j.body)(lo, hi);
      } catch (...) {  // e.g. a kernel refusing a dtype: raised on the caller, as without workers
        if (!j.failed.exchange(true)) j.error = std::current_exception();
      }
    }, &job);
    if (job.error) std::rethrow_exception(job.error);  // run() returned: every range has finished
    return ran;
  }

 private:
  // Everything a pool thread reads. Never freed (threads hold a pointer); a
  // forked child, which has none of the parent's threads, gets a new pool.
  struct Shared {
    // (job generation << 32) | next part to claim: one word, so that a
    // thread still looking at a finished job can never claim a part of the
    // next one (its compare-exchange sees the generation changed).
    std::atomic<uint64_t> claim{0};
    // The job of generation g lives in job[g & 1], written before `claim`
    // publishes g. Two slots because the writer of job g + 1 runs while
    // `claim` still says g: a thread that has just read a word of g (its
    // last part, say) must find g's job, not half of the next one. With one
    // slot it could read the next job's larger part count, then claim a part
    // "of g" past g's end and run the next job's function on it, so that
    // part ran twice and `done` overshot (a hang, or a job declared finished
    // while a thread still worked on it). Slot g & 1 is written again only
    // by job g + 2, once `claim` has moved to g + 1, when every
    // compare-exchange on a word of g fails.
    struct Job {
      std::atomic<PartFn> fn{nullptr};
      std::atomic<void*> ctx{nullptr};
      std::atomic<size_t> parts{0};
    } job[2];
    std::atomic<size_t> done{0};  // parts of the current job finished
    std::atomic<int64_t> spinNs{0};
    ShmWakeup jobs, finished;     // futex words (process-local use works the same)
  };
  static size_t runParts(Shared& s, uint32_t generation);
  static void loop(Shared* s, uint32_t seen);

  std::mutex mu_;  // held for a whole job, and while adding threads
  Shared* shared_ = new Shared;
  std::atomic<int> threads_{0};
};

}  // namespace roce
