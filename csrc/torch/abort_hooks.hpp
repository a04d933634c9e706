// The abort hooks torch >= 2.15 registers on a backend (registerAbortHook):
// run on the thread that sees the first failure that breaks the group (an
// operation's timeout, a dead or failed peer, an abort), before the failed
// operation's Work completes with the error, so that a hook can capture
// debug state while the group's ranks are still as the failure left them.
// Hooks are called without the lock held (a hook may take long or register
// another), each on its own: one that throws is logged and the rest still run.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../common/log.hpp"

namespace roce {

class AbortHooks {
 public:
  using Hook = std::function<void()>;

  void add(int64_t id, Hook hook) {
    std::lock_guard<std::mutex> g(mu_);
    hooks_[id] = std::move(hook);
  }
  void remove(int64_t id) {
    std::lock_guard<std::mutex> g(mu_);
    hooks_.erase(id);
  }
  // In the order of their ids.
  void run(const std::string& who) const {
    std::vector<std::pair<int64_t, Hook>> hooks;
    {
      std::lock_guard<std::mutex> g(mu_);
      hooks.assign(hooks_.begin(), hooks_.end());
    }
    for (const auto& [id, hook] : hooks) {
      try {
        hook();
      } catch (const std::exception& e) {
        ROCE_WARN("roce: ", who, ": abort hook ", id, " raised: ", e.what());
      } catch (...) {
        ROCE_WARN("roce: ", who, ": abort hook ", id, " raised a non-standard exception");
      }
    }
  }

 private:
  mutable std::mutex mu_;
  std::map<int64_t, Hook> hooks_;
};

}  // namespace roce
