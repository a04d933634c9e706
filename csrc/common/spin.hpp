// The first phase of every short wait: spin on the condition for a bounded
// time, then let the caller block (futex) instead of burning a core. Ranks
// often outnumber cores, so the budget is small and time-based (a pause
// instruction lasts 10 to 140 cycles depending on the CPU, so a count would
// mean very different times). See docs/PERFORMANCE.md for how it was chosen.
#pragma once
#include <chrono>
#include <cstdint>

#include "backoff.hpp"

namespace roce {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// True as soon as ready() holds; false once `budget` has passed without it.
template <class Ready>
bool spinFor(Ready&& ready, std::chrono::nanoseconds budget) {
  if (ready()) return true;
  if (budget.count() <= 0) return false;
  const auto end = Clock::now() + budget;
  for (uint32_t i = 1;; ++i) {
    if (ready()) return true;
    cpuRelax();
    if ((i & 31) == 0 && Clock::now() >= end) return ready();
  }
}

}  // namespace roce
