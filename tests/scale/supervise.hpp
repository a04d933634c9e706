// The launcher's loop while the ranks run: serve the store, reap the ranks,
// and stop the run when it hangs.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace scale {

class StoreServer;

struct RankOutcome {
  enum class Kind { Exited, Signalled, Stopped };  // Stopped: killed by the harness
  Kind kind = Kind::Stopped;
  int code = 0;  // exit status, or the signal
};

struct Supervision {
  std::vector<RankOutcome> ranks;
  std::string stoppedBecause;  // why ranks were Stopped, "" if none was
};

// Serves the store until every rank exited. Ranks still running at `limit`,
// or `grace` after the first rank failed (a rank waiting in the store for one
// that is gone would wait its whole group timeout), are killed and reported
// as Stopped.
Supervision superviseRanks(StoreServer& server, const std::vector<pid_t>& pids,
                           std::chrono::steady_clock::time_point limit, std::chrono::seconds grace);

}  // namespace scale
