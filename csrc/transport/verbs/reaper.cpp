#include "reaper.hpp"

#include <unistd.h>

#include <deque>
#include <mutex>
#include <thread>

#include "../../common/backoff.hpp"
#include "../../common/log.hpp"
#include "cq_set.hpp"
#include "landing_pool.hpp"
#include "reg_cache.hpp"
#include "staging_pool.hpp"
#include "verbs_pair.hpp"

namespace roce::transport::verbs {
namespace {

struct Reaper {
  std::mutex mu;
  std::deque<std::pair<std::unique_ptr<VerbsRemains>, std::chrono::milliseconds>> queue;
  bool running = false;
  size_t pending = 0;  // queued or being released
};

// Leaked on purpose: the thread may still run while static objects are
// destroyed at exit. A forked child gets its own (the parent's thread is
// not there).
Reaper& reaper() {
  static std::mutex mu;
  static Reaper* r = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> g(mu);
  if (r == nullptr || owner != getpid()) {
    r = new Reaper;
    owner = getpid();
  }
  return *r;
}

void release(std::unique_ptr<VerbsRemains> remains, std::chrono::milliseconds delay) {
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  const auto t0 = Clock::now();
  remains.reset();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  if (ms >= 1000)
    ROCE_WARN("verbs: the driver took ", ms, " ms to destroy a broken group's queue pairs and registrations "
              "(Soft-RoCE waits up to 50 s for packets a downed port still holds); the group's destroy did "
              "not wait for it");
}

void reap(Reaper* r) {
  for (;;) {
    std::unique_ptr<VerbsRemains> remains;
    std::chrono::milliseconds delay{0};
    {
      std::lock_guard<std::mutex> g(r->mu);
      if (r->queue.empty()) {
        r->running = false;
        return;
      }
      remains = std::move(r->queue.front().first);
      delay = r->queue.front().second;
      r->queue.pop_front();
    }
    release(std::move(remains), delay);
    std::lock_guard<std::mutex> g(r->mu);
    --r->pending;
  }
}

}  // namespace

VerbsRemains::VerbsRemains() = default;

VerbsRemains::~VerbsRemains() {
  pairs.clear();
  regCaches.clear();
  cqs.clear();
  landing.reset();
  staging.reset();
  rails.clear();
}

void releaseLater(std::unique_ptr<VerbsRemains> remains, std::chrono::milliseconds delay) {
  Reaper& r = reaper();
  {
    std::lock_guard<std::mutex> g(r.mu);
    r.queue.emplace_back(std::move(remains), delay);  // may throw: the caller then destroys them
    ++r.pending;
    if (r.running) return;
    try {
      std::thread(reap, &r).detach();
      r.running = true;
      return;
    } catch (...) {
      remains = std::move(r.queue.back().first);  // no thread (EAGAIN): released below, on this one
      r.queue.pop_back();
      --r.pending;
    }
  }
  ROCE_WARN("verbs: no thread could be started to release a broken group's objects; destroying them now");
  release(std::move(remains), std::chrono::milliseconds(0));
}

size_t remainsPending() {
  Reaper& r = reaper();
  std::lock_guard<std::mutex> g(r.mu);
  return r.pending;
}

}  // namespace roce::transport::verbs
