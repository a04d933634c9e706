// The abort hooks torch >= 2.15 registers on a backend (registerAbortHook):
// run on the thread that sees the first failure that breaks the group (an
// operation's timeout, a dead or failed peer), before the failed operation's
// Work completes with the error, so that a hook can capture debug state while
// the group's ranks are still as the failure left them. Not when the program
// itself aborts or destroys the group (the backend skips them then).
//
// Hooks registered from Python hold the GIL-taking wrappers pybind makes:
// copying or destroying one takes the GIL. So the table is an immutable list
// behind a shared_ptr, as for the completion hooks: run() copies the pointer
// under the lock and calls the hooks without it (never the GIL under the
// lock), and a list replaced by add/remove is freed outside the lock.
// A hook that throws is logged and the rest still run, in id order.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "../common/log.hpp"

namespace roce {

class AbortHooks {
 public:
  using Hook = std::function<void()>;

  void add(int64_t id, Hook hook) {
    std::shared_ptr<const List> old;
    std::lock_guard<std::mutex> g(mu_);
    auto next = std::make_shared<List>(list_ ? *list_ : List());
    (*next)[id] = std::move(hook);
    old = std::exchange(list_, std::move(next));
  }
  void remove(int64_t id) {
    std::shared_ptr<const List> old;
    std::lock_guard<std::mutex> g(mu_);
    if (!list_ || !list_->count(id)) return;
    auto next = std::make_shared<List>(*list_);
    next->erase(id);
    old = std::exchange(list_, std::move(next));
  }
  void run(const std::string& who) const {
    std::shared_ptr<const List> list;
    {
      std::lock_guard<std::mutex> g(mu_);
      list = list_;
    }
    if (!list) return;
    for (const auto& [id, hook] : *list) {
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
  using List = std::map<int64_t, Hook>;
  mutable std::mutex mu_;
  std::shared_ptr<const List> list_;
};

}  // namespace roce
