// A table of hooks torch registers on a backend by id (completion hooks,
// abort hooks), read far more often than changed. Readers copy a shared_ptr
// to an immutable list under the lock and call the hooks without it: a hook
// may block on torch's own mutex while the thread holding that mutex
// unregisters from us. Hooks registered from Python are pybind wrappers whose
// copy and destruction take the GIL, so no hook is copied or destroyed under
// the lock either: a list that add/remove replaced is freed after it.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace roce::adapter {

template <class Hook>
class HookList {
 public:
  // Replaces a hook registered with the same id.
  void add(int64_t id, const Hook& hook) {
    update([&](List& l) {
      l[id] = hook;
      return true;
    });
  }
  void remove(int64_t id) {
    update([&](List& l) { return l.erase(id) > 0; });
  }
  // Calls call(id, hook) for each hook, in id order, without the lock held.
  // One atomic load when none is registered.
  template <class Call>
  void forEach(Call&& call) const {
    if (count_.load(std::memory_order_acquire) == 0) return;
    std::shared_ptr<const List> list;
    {
      std::lock_guard<std::mutex> g(mu_);
      list = list_;
    }
    if (!list) return;
    for (const auto& [id, hook] : *list) call(id, hook);
  }

 private:
  using List = std::map<int64_t, Hook>;
  // The list changed by `change` (false: nothing to change), copied and
  // changed outside the lock, published under it unless another update
  // came first (then again from that one's list).
  template <class Change>
  void update(Change&& change) {
    for (;;) {
      std::shared_ptr<const List> seen, old;  // destroyed after the lock is released
      {
        std::lock_guard<std::mutex> g(mu_);
        seen = list_;
      }
      auto next = std::make_shared<List>(seen ? *seen : List());
      if (!change(*next)) return;
      std::lock_guard<std::mutex> g(mu_);
      if (list_ != seen) continue;
      old = publish(std::move(next));
      return;
    }
  }
  std::shared_ptr<const List> publish(std::shared_ptr<List> next) {
    count_.store(static_cast<int>(next->size()), std::memory_order_release);
    return std::exchange(list_, std::move(next));
  }

  mutable std::mutex mu_;
  std::shared_ptr<const List> list_;
  std::atomic<int> count_{0};
};

}  // namespace roce::adapter
