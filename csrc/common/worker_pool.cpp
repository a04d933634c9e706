#include "worker_pool.hpp"

#include <cstdint>
#include <pthread.h>

#include <chrono>
#include <thread>

#include "log.hpp"
#include "spin.hpp"

namespace roce {
namespace {
uint32_t generationOf(uint64_t claim) { return static_cast<uint32_t>(claim >> 32); }

WorkerPool* processPool = nullptr;

// A forked child has none of its parent's threads, and the parent's mutex
// may have been held at the fork by one of them (every job holds it): a
// child that creates a group would block on it for good. So the child gets a
// new pool; the old one is leaked (its state is the parent's). Runs in the
// child before fork() returns there, on its only thread.
void newPoolInChild() { processPool = new WorkerPool; }
}  // namespace

WorkerPool& WorkerPool::process() {
  // Never destroyed: its threads run until the process exits, and static
  // destructors must not pull the shared state from under them.
  static const bool made = [] {
    processPool = new WorkerPool;
    pthread_atfork(nullptr, nullptr, newPoolInChild);
    return true;
  }();
  (void)made;
  return *processPool;
}

void WorkerPool::ensureThreads(int threads, int spinUs) {
  std::lock_guard<std::mutex> g(mu_);
  // The first caller sets the spin; later ones may only shorten it.
  const int64_t spinNs = int64_t(spinUs) * 1000;
  if (threads_.load(std::memory_order_relaxed) == 0 || spinNs < shared_->spinNs.load(std::memory_order_relaxed))
    shared_->spinNs.store(spinNs, std::memory_order_relaxed);
  // No job runs while mu_ is held: a new thread starts at the current generation.
  const uint32_t now = generationOf(shared_->claim.load(std::memory_order_relaxed));
  for (int i = threads_.load(std::memory_order_relaxed); i < threads; ++i) {
    std::thread(loop, shared_, now).detach();
    threads_.store(i + 1, std::memory_order_relaxed);
  }
}

size_t WorkerPool::runParts(Shared& s, uint32_t generation) {
  size_t ran = 0;
  uint64_t c = s.claim.load(std::memory_order_acquire);
  const Shared::Job& job = s.job[generation & 1];
  while (generationOf(c) == generation) {
    // Read before the claim: if this slot was rewritten since `c` was loaded
    // (by job generation + 2), the compare-exchange below fails, since the
    // word's generation moved on first. Acquire: reading a newer job's field
    // makes its publication, and so the move of the word, visible here.
    const size_t parts = job.parts.load(std::memory_order_acquire);
    const PartFn fn = job.fn.load(std::memory_order_acquire);
    void* ctx = job.ctx.load(std::memory_order_acquire);
    const uint32_t part = static_cast<uint32_t>(c);
    if (part >= parts) break;
    if (!s.claim.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    fn(ctx, part);
    ++ran;
    // seq_cst: the waiter's "announce a sleeper, re-check" (futex.hpp).
    s.done.fetch_add(1, std::memory_order_seq_cst);
    s.finished.notify();
    c = s.claim.load(std::memory_order_acquire);
  }
  return ran;
}

void WorkerPool::loop(Shared* s, uint32_t seen) {
  pthread_setname_np(pthread_self(), "roce-worker");  // top -H, py-spy, tests (threads' CPU time)
  auto ready = [&] { return generationOf(s->claim.load(std::memory_order_seq_cst)) != seen; };
  for (;;) {
    const auto spin = std::chrono::nanoseconds(s->spinNs.load(std::memory_order_relaxed));
    if (!spinFor(ready, spin))
      while (!s->jobs.sleep(ready, 100000000)) {
      }
    seen = generationOf(s->claim.load(std::memory_order_acquire));
    runParts(*s, seen);
  }
}

size_t WorkerPool::run(size_t parts, PartFn fn, void* ctx) {
  std::unique_lock<std::mutex> busy(mu_, std::try_to_lock);
  if (!busy.owns_lock() || threads_.load(std::memory_order_relaxed) == 0) {
    // Another job holds the pool (or there is none): queueing behind it would
    // only add its latency to ours; the caller's core does the whole job.
    for (size_t i = 0; i < parts; ++i) fn(ctx, i);
    return 0;
  }
  Shared& s = *shared_;
  const uint32_t generation = generationOf(s.claim.load(std::memory_order_relaxed)) + 1;
  Shared::Job& job = s.job[generation & 1];
  s.done.store(0, std::memory_order_relaxed);
  job.parts.store(parts, std::memory_order_release);
  job.fn.store(fn, std::memory_order_release);
  job.ctx.store(ctx, std::memory_order_release);
  s.claim.store(uint64_t(generation) << 32, std::memory_order_seq_cst);  // publishes the job
  // Wake at most the threads that can get a part (the caller takes one).
  s.jobs.notify(static_cast<int>(std::min<size_t>(parts - 1, INT32_MAX)));
  const size_t mine = runParts(s, generation);
  auto finished = [&] { return s.done.load(std::memory_order_seq_cst) == parts; };
  const auto spin = std::chrono::nanoseconds(s.spinNs.load(std::memory_order_relaxed));
  if (!spinFor(finished, spin)) {
    // A range takes micro- to milliseconds; a wait of seconds means a worker
    // that holds a range is not being scheduled (or is stuck): say so once,
    // with the state a debugger would need, instead of hanging silently.
    for (long slept = 0; !s.finished.sleep(finished, 1000000); ++slept)
      if (slept == 10000) try {
        // Must not throw (bad_alloc building the message): unwinding here
        // would free the caller's job while threads still run its parts.
        ROCE_WARN("worker pool: waited 10 s for ", parts - s.done.load(), " of ", parts,
                  " ranges that worker threads claimed (job ", generation, ", ", threads(),
                  " threads); still waiting. A worker thread is not being scheduled or is stuck: "
                  "attach a debugger to threads named roce-worker");
      } catch (...) {
      }
  }
  return parts - mine;
}

}  // namespace roce
