// A self-check of the worker pool's job hand-off (common/worker_pool.hpp),
// for tests (roce_pg._C._check_worker_pool): many tiny jobs back to back
// whose part counts alternate between small and large, the pattern in which
// a thread finishing one job's last part meets the next job being written.
// Each part must run exactly once, and before run() returns.
#pragma once
#include <cstddef>

namespace roce {

struct WorkerPoolCheck {
  size_t jobs = 0;
  size_t parts = 0;          // parts the jobs had, in all
  size_t poolParts = 0;      // of those, run by pool threads (else the check proved nothing)
  size_t missing = 0;        // parts not run by the time run() returned
  size_t repeated = 0;       // extra runs of a part seen when run() returned
  size_t late = 0;           // runs that happened after their job's run() returned
};

// Runs `jobs` jobs on WorkerPool::process(), first making it hold `threads`
// threads (spinning `spinUs` when idle, as ensureThreads).
WorkerPoolCheck checkWorkerPool(int threads, int spinUs, size_t jobs);

}  // namespace roce
