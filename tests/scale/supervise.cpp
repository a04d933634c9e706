#include "supervise.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <unordered_map>

#include "store_server.hpp"

namespace scale {

Supervision superviseRanks(StoreServer& server, const std::vector<pid_t>& pids,
                           std::chrono::steady_clock::time_point limit, std::chrono::seconds grace) {
  using Clock = std::chrono::steady_clock;
  Supervision s;
  s.ranks.resize(pids.size());
  std::unordered_map<pid_t, size_t> running;
  for (size_t r = 0; r < pids.size(); ++r) running[pids[r]] = r;
  auto stopAt = limit;
  bool afterFailure = false;
  while (!running.empty()) {
    server.serveFor(std::chrono::milliseconds(50));
    int status;
    for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;) {
      auto it = running.find(pid);
      if (it == running.end()) continue;
      RankOutcome& out = s.ranks[it->second];
      out.kind = WIFEXITED(status) ? RankOutcome::Kind::Exited : RankOutcome::Kind::Signalled;
      out.code = WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status);
      running.erase(it);
      const bool failed = out.kind != RankOutcome::Kind::Exited || out.code != 0;
      if (failed && Clock::now() + grace < stopAt) {
        stopAt = Clock::now() + grace;
        afterFailure = true;
      }
    }
    if (!running.empty() && Clock::now() >= stopAt) {
      s.stoppedBecause = afterFailure ? "another rank had failed" : "the time limit passed";
      for (const auto& [pid, rank] : running) kill(pid, SIGKILL);
      for (const auto& [pid, rank] : running) waitpid(pid, &status, 0);
      running.clear();  // their outcomes stay Stopped
    }
  }
  return s;
}

}  // namespace scale
