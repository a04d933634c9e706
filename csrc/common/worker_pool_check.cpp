#include "worker_pool_check.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "worker_pool.hpp"

namespace roce {

WorkerPoolCheck checkWorkerPool(int threads, int spinUs, size_t jobs) {
  // Alternating counts: a thread that has just read the word of a 2-part job
  // is the one that would see an 8-part job's count if the hand-off let it.
  constexpr size_t kCounts[] = {2, 8, 3, 7};
  constexpr size_t kMaxParts = 8;
  WorkerPool& pool = WorkerPool::process();
  pool.ensureThreads(threads, spinUs);
  // Every job's counters stay allocated to the end, so a run that comes
  // late writes into memory that is still ours, and is counted.
  std::unique_ptr<std::atomic<uint32_t>[]> hits(new std::atomic<uint32_t>[jobs * kMaxParts]());
  WorkerPoolCheck out;
  out.jobs = jobs;
  size_t seenAtReturn = 0;
  for (size_t j = 0; j < jobs; ++j) {
    const size_t parts = kCounts[j % std::size(kCounts)];
    std::atomic<uint32_t>* mine = &hits[j * kMaxParts];
    out.poolParts += pool.run(parts, [](void* ctx, size_t part) noexcept {
      static_cast<std::atomic<uint32_t>*>(ctx)[part].fetch_add(1, std::memory_order_relaxed);
    }, mine);
    out.parts += parts;
    for (size_t p = 0; p < kMaxParts; ++p) {
      const uint32_t n = mine[p].load(std::memory_order_relaxed), expected = p < parts ? 1 : 0;
      seenAtReturn += n;
      if (n < expected) ++out.missing;
      if (n > expected) out.repeated += n - expected;
    }
  }
  // A run still under way when its job returned lands within microseconds.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  size_t seenAtEnd = 0;
  for (size_t i = 0; i < jobs * kMaxParts; ++i) seenAtEnd += hits[i].load(std::memory_order_relaxed);
  out.late = seenAtEnd - seenAtReturn;
  return out;
}

}  // namespace roce
