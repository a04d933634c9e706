// roce_scale: runs a roce group of many torch-free ranks on this machine and
// reports what each rank costs (see options.cpp for the command line).
//
// The launcher opens the store's listener, forks the ranks (before any thread
// or group exists, so each child starts as a plain copy), then serves the
// store on its only thread while it reaps them, and kills what still runs at
// the time limit, naming where each such rank was.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "memory_plan.hpp"
#include "options.hpp"
#include "rank.hpp"
#include "store_server.hpp"
#include "summary.hpp"
#include "supervise.hpp"

namespace scale {
namespace {

// After one rank failed, the others get this long to notice (the lifelines
// tell a group's ranks within a second) before they are stopped.
constexpr auto kGraceAfterFailure = std::chrono::seconds(20);

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "roce_scale: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(2);
}

// What every rank shares, unless the caller set it: TCP between the simulated
// machines (there is no RDMA device here), and small shared-memory rings and
// slots, so that a thousand ranks fit in memory.
void setDefaultEnvironment() {
  setenv("ROCE_PG_NET_TRANSPORT", "tcp", 0);
  setenv("ROCE_PG_SHM_RING_BYTES", "65536", 0);
  setenv("ROCE_PG_SHM_SLOT_BYTES", "65536", 0);
}

roce::UniqueFd listenOnLoopback(int& port) {
  roce::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("bind");
  // Every rank connects at once: let the kernel queue as many as it allows.
  if (listen(fd.get(), SOMAXCONN) != 0) die("listen");
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) die("getsockname");
  port = ntohs(addr.sin_port);
  return fd;
}

std::vector<pid_t> forkRanks(const Options& o, int port, int listener) {
  std::fflush(nullptr);  // or every child would print the launcher's buffered output again
  const pid_t launcher = getpid();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < o.ranks; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      die("fork of rank " + std::to_string(rank));
    }
    if (pid == 0) {
      close(listener);
      const int status = rankMain(o, rank, port, launcher);
      std::fflush(nullptr);
      _exit(status);  // not exit(): the launcher's atexit work is not the rank's
    }
    pids.push_back(pid);
  }
  return pids;
}

// "3, 7-9, 12"
std::string ranksLabel(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return s;
}

RunResult collect(const Options& o, const StoreServer& server, const Supervision& sup) {
  constexpr size_t kErrorsShown = 8;
  RunResult r;
  r.reports.resize(o.ranks);
  std::map<std::string, std::vector<int>> stoppedAt;  // stage -> ranks
  // A failure travels: the others report that they stopped because of the
  // rank that saw it first. Show ranks that died first, then first-hand
  // failures, then the echoes.
  std::vector<std::string> deaths, origins, echoes;
  const auto isEcho = [](const std::string& e) {
    for (const char* mark : {" stopped: ", "first failure reported in the group", "failed earlier"})
      if (e.find(mark) != std::string::npos) return true;
    return false;
  };
  for (int rank = 0; rank < o.ranks; ++rank) {
    if (const std::string* text = server.find("report/" + std::to_string(rank))) r.reports[rank] = RankReport::decode(*text);
    const RankOutcome& out = sup.ranks[rank];
    if (out.kind == RankOutcome::Kind::Stopped) {
      const std::string* stage = server.find("stage/" + std::to_string(rank));
      stoppedAt[stage ? *stage : "before its first step"].push_back(rank);
    } else if (out.kind == RankOutcome::Kind::Signalled) {
      deaths.push_back("rank " + std::to_string(rank) + " was killed by signal " + std::to_string(out.code) + " (" +
                        strsignal(out.code) + ")");
    } else if (out.code != 0) {
      const bool reported = r.reports[rank] && !r.reports[rank]->error.empty();
      const std::string error = reported ? r.reports[rank]->error : "exited with status " + std::to_string(out.code);
      (isEcho(error) ? echoes : origins).push_back("rank " + std::to_string(rank) + ": " + error);
    }
  }
  std::vector<std::string> failures = deaths;
  failures.insert(failures.end(), origins.begin(), origins.end());
  failures.insert(failures.end(), echoes.begin(), echoes.end());
  for (size_t i = 0; i < failures.size() && i < kErrorsShown; ++i) r.problems.push_back(failures[i]);
  if (failures.size() > kErrorsShown)
    r.problems.push_back(std::to_string(failures.size() - kErrorsShown) + " more ranks failed");
  for (const auto& [stage, ranks] : stoppedAt)
    r.problems.push_back("ranks " + ranksLabel(ranks) + " were still running when the harness stopped them (" +
                         sup.stoppedBecause + "), at: " + stage);
  return r;
}

}  // namespace
}  // namespace scale

int main(int argc, char** argv) {
  using namespace scale;
  Options o = parseOptions(argc, argv);
  setDefaultEnvironment();
  std::vector<std::string> notes = dropSizesThatDoNotFit(o);
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(o.timeLimitS);
  int port = 0;
  roce::UniqueFd listener = listenOnLoopback(port);
  const std::vector<pid_t> pids = forkRanks(o, port, listener.get());
  StoreServer server(std::move(listener));
  const Supervision sup = superviseRanks(server, pids, limit, kGraceAfterFailure);
  RunResult result = collect(o, server, sup);
  result.notes = std::move(notes);
  result.storeRequests = server.traffic().requests;
  result.storeBytesIn = server.traffic().bytesIn;
  result.storeBytesOut = server.traffic().bytesOut;
  if (o.checks == Options::Checks::Few)
    result.notes.push_back("--checks few: the large reduce, gather, scatter and alltoallv were not run");
  if (o.checks == Options::Checks::None)
    result.notes.push_back("--checks none: only the timed allreduces were checked; the default group's resources "
                           "are measured right after init, with no connection made yet");
  printSummary(o, result);
  if (!o.jsonPath.empty()) writeJson(o, result, o.jsonPath);
  return result.ok() ? 0 : 1;
}
