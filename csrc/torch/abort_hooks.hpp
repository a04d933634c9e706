// The abort hooks torch >= 2.15 registers on a backend (registerAbortHook):
// run on the thread that sees the first failure that breaks the group (an
// operation's timeout, a dead or failed peer), before the failed operation's
// Work completes with the error, so that a hook can capture debug state while
// the group's ranks are still as the failure left them. Not when the program
// itself aborts or destroys the group (the backend skips them then).
// A hook that throws is logged and the rest still run, in id order; the table
// never copies or destroys a hook under its lock (hook_list.hpp).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "../common/log.hpp"
#include "hook_list.hpp"

namespace roce::adapter {

class AbortHooks {
 public:
  using Hook = std::function<void()>;

  void add(int64_t id, Hook hook) { hooks_.add(id, std::move(hook)); }
  void remove(int64_t id) { hooks_.remove(id); }
  void run(const std::string& who) const {
    hooks_.forEach([&](int64_t id, const Hook& hook) {
      try {
        hook();
      } catch (const std::exception& e) {
        ROCE_WARN("roce: ", who, ": abort hook ", id, " raised: ", e.what());
      } catch (...) {
        ROCE_WARN("roce: ", who, ": abort hook ", id, " raised a non-standard exception");
      }
    });
  }

 private:
  HookList<Hook> hooks_;
};

}  // namespace roce::adapter
