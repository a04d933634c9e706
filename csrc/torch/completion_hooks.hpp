// The completion hooks torch's flight-recorder hook registers on a backend
// (c10d::Backend::registerCompletionHook, torch >= 2.15): roce calls them when
// an operation completes successfully, so torch's entries for roce read
// "completed" with roce's duration instead of retiring when the op is issued.
// Failed operations fire nothing (torch's contract: a dump must keep showing
// that they never finished).
//
// The table is read on every completion (hook_list.hpp: no lock held while a
// hook runs).
#pragma once
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "hook_list.hpp"

// Backend's completion-hook API and Work::getCompletionKey arrived after
// torch 2.11 (the oldest torch roce builds against); 2.15 has them.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
#define ROCE_TORCH_COMPLETION_HOOKS 1
// Backend::split(store, ranks, opts), which split_group calls: verified on
// 2.15's headers only, so older torches keep split_group's "not supported".
#define ROCE_TORCH_BACKEND_SPLIT 1
#endif

namespace roce::adapter {

class CompletionHooks {
 public:
  using Hook = std::function<void(uint64_t key, std::optional<float> durationMs)>;

  void add(int64_t id, Hook hook) { hooks_.add(id, std::move(hook)); }
  void remove(int64_t id) { hooks_.remove(id); }
  // One atomic load when nothing is registered (TORCH_FR_BUFFER_SIZE=0).
  void fire(uint64_t key, std::optional<float> durationMs) const {
    hooks_.forEach([&](int64_t, const Hook& hook) {
      try {
        hook(key, durationMs);
      } catch (...) {
        // A consumer's failure must not fail the collective that completed.
      }
    });
  }

 private:
  HookList<Hook> hooks_;
};

}  // namespace roce::adapter
