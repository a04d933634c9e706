// The completion hooks torch's flight-recorder hook registers on a backend
// (c10d::Backend::registerCompletionHook, torch >= 2.15): roce calls them when
// an operation completes successfully, so torch's entries for roce read
// "completed" with roce's duration instead of retiring when the op is issued.
// Failed operations fire nothing (torch's contract: a dump must keep showing
// that they never finished).
//
// The table is read on every completion and changed only when a hook is
// attached or removed: readers copy a shared_ptr to an immutable list and call
// the hooks without holding the lock, because torch's hook may be blocked on
// its own mutex while the thread that holds it unregisters from us.
#pragma once
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

// Backend's completion-hook API and Work::getCompletionKey arrived after
// torch 2.11 (the oldest torch roce builds against); 2.15 has them.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
#define ROCE_TORCH_COMPLETION_HOOKS 1
// Backend::split(store, ranks, opts), which split_group calls: verified on
// 2.15's headers only, so older torches keep split_group's "not supported".
#define ROCE_TORCH_BACKEND_SPLIT 1
#endif

namespace roce {

class CompletionHooks {
 public:
  using Hook = std::function<void(uint64_t key, std::optional<float> durationMs)>;

  void add(int64_t id, Hook hook) {
    std::lock_guard<std::mutex> g(mu_);
    auto next = std::make_shared<List>(list_ ? *list_ : List());
    next->emplace_back(id, std::move(hook));
    publish(std::move(next));
  }
  void remove(int64_t id) {
    std::lock_guard<std::mutex> g(mu_);
    if (!list_) return;
    auto next = std::make_shared<List>(*list_);
    next->erase(std::remove_if(next->begin(), next->end(), [&](const auto& h) { return h.first == id; }), next->end());
    publish(std::move(next));
  }
  // One atomic load when nothing is registered (TORCH_FR_BUFFER_SIZE=0).
  void fire(uint64_t key, std::optional<float> durationMs) const {
    if (count_.load(std::memory_order_acquire) == 0) return;
    std::shared_ptr<const List> list;
    {
      std::lock_guard<std::mutex> g(mu_);
      list = list_;
    }
    if (!list) return;
    for (const auto& [id, hook] : *list) {
      try {
        hook(key, durationMs);
      } catch (...) {
        // A consumer's failure must not fail the collective that completed.
      }
    }
  }

 private:
  using List = std::vector<std::pair<int64_t, Hook>>;
  void publish(std::shared_ptr<List> next) {
    count_.store(static_cast<int>(next->size()), std::memory_order_release);
    list_ = std::move(next);
  }

  mutable std::mutex mu_;
  std::shared_ptr<const List> list_;
  std::atomic<int> count_{0};
};

}  // namespace roce
