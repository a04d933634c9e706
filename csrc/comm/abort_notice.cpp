#include "abort_notice.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "../common/bootstrap.hpp"
#include "../common/log.hpp"

namespace roce {
namespace {
// How often the store is asked; each ask is one round trip to rank 0's store.
constexpr auto kPollEvery = std::chrono::milliseconds(200);
// How long the destructor waits for a store call in flight before leaving it behind.
// How long after the last seen() the store is still polled.
constexpr auto kAskedRecently = std::chrono::seconds(1);
constexpr auto kStopWait = std::chrono::milliseconds(200);
}  // namespace

struct AbortNotice::State {
  std::unique_ptr<Bootstrap> store;
  std::string key;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool finished = false;
  std::optional<std::string> seen;
  std::optional<std::string> toPublish;
  bool storeFailed = false;  // logged once
  // The store is asked only while someone is waiting on the group (seen() was
  // called lately): an idle group costs rank 0's store nothing.
  std::chrono::steady_clock::time_point lastAsked{};

  void run() {
    std::unique_lock<std::mutex> g(mu);
    for (;;) {
      std::optional<std::string> publishing = std::move(toPublish);
      toPublish.reset();
      // A notice published just before the group is destroyed still gets one try.
      if (stop && !publishing) break;
      const bool wanted = std::chrono::steady_clock::now() - lastAsked < kAskedRecently;
      if (!wanted && !publishing) {
        cv.wait_for(g, kPollEvery, [&] { return stop || toPublish.has_value(); });
        continue;
      }
      g.unlock();
      // The store call may block for the store's timeout: never under `mu`.
      std::optional<std::string> got;
      bool failed = false;
      try {
        got = store->tryGet(key);
        if (!got && publishing) store->set(key, *publishing);
      } catch (const std::exception& e) {
        failed = true;
        if (!storeFailed) ROCE_INFO("abort notice: the store is unreachable (", e.what(), ")");
      }
      g.lock();
      if (failed) storeFailed = true;
      if (got && !seen) seen = std::move(got);
      if (stop) break;
      if (failed && publishing && !toPublish) toPublish = std::move(publishing);  // try again
      cv.wait_for(g, kPollEvery, [&] { return stop || toPublish.has_value(); });
    }
    finished = true;
    cv.notify_all();
  }
};

AbortNotice::AbortNotice(std::unique_ptr<Bootstrap> store, std::string key) : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->key = std::move(key);
  std::thread([s = state_] { s->run(); }).detach();
}

AbortNotice::~AbortNotice() {
  std::unique_lock<std::mutex> g(state_->mu);
  state_->stop = true;
  state_->cv.notify_all();
  // A thread stuck in a store call keeps the state (and the store connection)
  // alive through its own reference and ends when the call returns.
  state_->cv.wait_for(g, kStopWait, [&] { return state_->finished; });
}

std::optional<std::string> AbortNotice::seen() const {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->lastAsked = std::chrono::steady_clock::now();
  return state_->seen;
}

void AbortNotice::publish(const std::string& msg) {
  std::lock_guard<std::mutex> g(state_->mu);
  if (!state_->toPublish) state_->toPublish = msg;
  state_->cv.notify_all();
}

}  // namespace roce
