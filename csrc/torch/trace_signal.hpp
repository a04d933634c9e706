// Trace dumps on request by signal (ROCE_PG_TRACE_SIGNAL=SIGUSR1|SIGUSR2,
// opt-in): `kill -USR1 <pid>` makes every roce group of that process write
// its flight recorder to ROCE_PG_TRACE_DUMP's prefix, also while the process
// hangs inside a collective (the Python-level signal module cannot: its
// handlers run between bytecodes, on a main thread that is stuck in C++).
//
// The handler only writes to an eventfd (async-signal-safe); a thread of its
// own, started with the first group that asks, does the dumping. Process-wide
// and never torn down, like the worker pool: the registry is what changes as
// groups come and go. The handler replaces the signal's previous disposition
// (a Python handler for the same signal then never runs).
#pragma once
#include <cstdint>
#include <functional>

namespace roce::adapter {

class TraceSignal {
 public:
  // Runs `dump` on the dumping thread each time `signo` arrives, until
  // remove(id). Installs the handler on the first call for `signo`.
  static uint64_t add(int signo, std::function<void()> dump);
  static void remove(uint64_t id);  // after it returns, `dump` is not running and will not run
};

}  // namespace roce::adapter
