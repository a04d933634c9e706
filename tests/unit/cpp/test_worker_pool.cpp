// The process's worker pool (csrc/common/worker_pool.*): every part of every
// job runs exactly once and before run() returns, under many tiny jobs whose
// part counts alternate between small and large (the pattern in which a
// thread finishing one job's last part meets the next job being written);
// children forked while jobs hold the pool's lock start pools of their own;
// forRanges covers its range once with aligned cuts and rethrows a range's
// exception; a job submitted while another runs runs on its caller; idle
// threads sleep.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/worker_pool.hpp"
#include "roce_check.hpp"

using roce::WorkerPool;

namespace {

// 7 threads: the pool a group of 8 workers makes (ROCE_PG_WORKERS=8);
// 20 us: the default ROCE_PG_SPIN_US, so idle threads catch jobs spinning.
constexpr int kThreads = 7;
constexpr int kSpinUs = 20;
// The hand-off this guards once let a thread run a part twice about once in
// 100,000 such jobs on 2 cores, which hung the caller for good.
constexpr size_t kJobs = 200000;
constexpr int kForks = 4;

struct HandOff {
  size_t jobs = 0;
  size_t parts = 0;      // parts the jobs had, in all
  size_t poolParts = 0;  // of those, run by pool threads (else the check proved nothing)
  size_t missing = 0;    // parts not run by the time run() returned
  size_t repeated = 0;   // extra runs of a part seen when run() returned
  size_t late = 0;       // runs that happened after their job's run() returned
};

HandOff checkHandOff(int threads, int spinUs, size_t jobs) {
  // Alternating counts: a thread that has just read the word of a 2-part job
  // is the one that would see an 8-part job's count if the hand-off let it.
  constexpr size_t kCounts[] = {2, 8, 3, 7};
  constexpr size_t kMaxParts = 8;
  WorkerPool& pool = WorkerPool::process();
  pool.ensureThreads(threads, spinUs);
  // Every job's counters stay allocated to the end, so a run that comes
  // late writes into memory that is still ours, and is counted.
  std::unique_ptr<std::atomic<uint32_t>[]> hits(new std::atomic<uint32_t>[jobs * kMaxParts]());
  HandOff out;
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

// Runs fn on a thread of its own and gives up after `seconds`: a hang in the
// pool must fail this test with a message, not stall the run until CI's own
// timeout. A hung thread cannot be joined, so the process exits.
template <class Fn>
void withDeadline(int seconds, const char* what, Fn&& fn) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto state = std::make_shared<State>();
  std::thread t([state, &fn] {
    fn();
    std::lock_guard<std::mutex> g(state->mu);
    state->done = true;
    state->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(state->mu);
  if (!state->cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return state->done; })) {
    unit::fail(__FILE__, __LINE__, unit::cat(what, " hung for ", seconds, " s"));
    std::fflush(stdout);
    std::_Exit(1);
  }
  lock.unlock();
  t.join();
}

double processCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace

TEST(hand_off_runs_every_part_once_before_run_returns) {
  HandOff r;
  std::vector<int> forked;
  withDeadline(60, "the worker pool check", [&] {
    // Children forked while the jobs run (each job holds the pool's lock):
    // a child starts pool threads of its own, as creating a group does, and
    // must not block on its parent's lock. SIGALRM after 20 s says it hung.
    std::thread forker([&] {
      for (int i = 0; i < kForks; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        std::fflush(stdout);
        std::fflush(stderr);
        const pid_t pid = fork();
        if (pid == 0) {
          alarm(20);
          const HandOff c = checkHandOff(2, 0, 2000);
          _exit(c.missing == 0 && c.repeated == 0 && c.late == 0 && c.parts == 5 * 2000 ? 0 : 1);
        }
        forked.push_back(pid);
      }
    });
    // Threads that keep every core busy, as the other ranks of a machine
    // do: pool threads are descheduled in the middle of hand-offs.
    std::atomic<bool> stop{false};
    std::vector<std::thread> busy;
    for (unsigned i = 0; i < std::max(1u, std::thread::hardware_concurrency()); ++i)
      busy.emplace_back([&] {
        while (!stop.load(std::memory_order_relaxed)) {
        }
      });
    r = checkHandOff(kThreads, kSpinUs, kJobs);
    stop = true;
    for (auto& t : busy) t.join();
    forker.join();
  });
  CHECK_EQ(r.jobs, kJobs);
  CHECK_EQ(r.parts, 5 * kJobs);  // (2 + 8 + 3 + 7) / 4 per job
  CHECK_EQ(r.missing, 0u);
  CHECK_EQ(r.repeated, 0u);
  CHECK_EQ(r.late, 0u);
  CHECK_GT(r.poolParts, 0u);  // the pool's threads took part
  CHECK_EQ(WorkerPool::process().threads(), kThreads);
  REQUIRE_EQ(forked.size(), static_cast<size_t>(kForks));
  for (pid_t pid : forked) {
    INFO("child ", pid);
    int status = -1;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) CHECK_EQ(WTERMSIG(status), 0);  // SIGALRM (14): it hung
    else CHECK_EQ(WEXITSTATUS(status), 0);
  }
}

TEST(ensure_threads_never_shrinks) {
  WorkerPool& pool = WorkerPool::process();
  pool.ensureThreads(3, kSpinUs);
  const int now = pool.threads();
  CHECK_GE(now, 3);
  pool.ensureThreads(1, kSpinUs);
  CHECK_EQ(pool.threads(), now);
}

TEST(for_ranges_covers_once_with_aligned_cuts) {
  WorkerPool& pool = WorkerPool::process();
  pool.ensureThreads(3, kSpinUs);
  for (size_t n : {size_t(0), size_t(1), size_t(63), size_t(1000), size_t(4096), size_t(100003)})
    for (size_t align : {size_t(1), size_t(16), size_t(64)})
      for (int parts : {1, 2, 4, 8}) {
        INFO("n=", n, " align=", align, " parts=", parts);
        std::vector<std::atomic<int>> seen(n);
        std::mutex mu;
        std::vector<std::pair<size_t, size_t>> ranges;
        pool.forRanges(n, align, 16, parts, [&](size_t lo, size_t hi) {
          for (size_t i = lo; i < hi; ++i) seen[i].fetch_add(1);
          std::lock_guard<std::mutex> g(mu);
          ranges.emplace_back(lo, hi);
        });
        size_t once = 0;
        for (auto& s : seen) once += s.load() == 1;
        CHECK_EQ(once, n);
        // At most `parts` ranges of at least about minLen (16), inner cuts aligned.
        CHECK_LE(ranges.size(), static_cast<size_t>(std::max(1, parts)));
        for (auto [lo, hi] : ranges) {
          CHECK_LE(lo, hi);
          if (lo != 0) CHECK_EQ(lo % align, 0u);
          if (hi != n) CHECK_EQ(hi % align, 0u);
        }
      }
}

TEST(for_ranges_small_work_stays_on_the_caller) {
  WorkerPool& pool = WorkerPool::process();
  pool.ensureThreads(3, kSpinUs);
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id ranOn;
  int calls = 0;
  // 100 elements at a minimum of 64 each: one range, the caller's.
  CHECK_EQ(pool.forRanges(100, 1, 64, 8, [&](size_t lo, size_t hi) {
    ++calls;
    ranOn = std::this_thread::get_id();
    CHECK_EQ(lo, 0u);
    CHECK_EQ(hi, 100u);
  }), 0u);
  CHECK_EQ(calls, 1);
  CHECK(ranOn == me);
}

TEST(for_ranges_rethrows_a_range_error_after_all_finish) {
  WorkerPool& pool = WorkerPool::process();
  pool.ensureThreads(3, kSpinUs);
  std::atomic<int> finished{0};
  auto job = [&] {
    pool.forRanges(8000, 1, 1000, 8, [&](size_t lo, size_t) {
      if (lo == 0) throw std::invalid_argument("reduce op BAND is not defined for dtype float32");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      finished.fetch_add(1);
    });
  };
  CHECK_THROWS(std::invalid_argument, job(), "is not defined for dtype float32");
  CHECK_EQ(finished.load(), 7);  // every other range ran to its end before the throw reached us
}

TEST(a_job_submitted_during_another_runs_on_its_caller) {
  WorkerPool& pool = WorkerPool::process();
  pool.ensureThreads(3, kSpinUs);
  struct Ctx {
    WorkerPool* pool;
    std::atomic<size_t> nestedByPool{0};
    std::atomic<int> nestedParts{0};
  } ctx{&pool};
  pool.run(4, [](void* p, size_t) noexcept {
    Ctx& c = *static_cast<Ctx*>(p);
    // The outer job holds the pool: this one must not wait for it.
    c.nestedByPool += c.pool->run(3, [](void* q, size_t) noexcept {
      static_cast<Ctx*>(q)->nestedParts.fetch_add(1);
    }, p);
  }, &ctx);
  CHECK_EQ(ctx.nestedParts.load(), 12);
  CHECK_EQ(ctx.nestedByPool.load(), 0u);
}

TEST(idle_threads_sleep) {
  WorkerPool& pool = WorkerPool::process();
  pool.ensureThreads(kThreads, kSpinUs);
  pool.run(8, [](void*, size_t) noexcept {}, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past the spin
  const double before = processCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Seven spinning threads would burn seconds of CPU in half a second.
  CHECK_LT(processCpuSeconds() - before, 0.05);
}
