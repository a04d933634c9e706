#include "rank.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "../../csrc/comm/communicator.hpp"
#include "../../csrc/common/error.hpp"
#include "../../csrc/common/bootstrap.hpp"
#include "../../csrc/common/config.hpp"
#include "../../csrc/group/group_builder.hpp"
#include "checks.hpp"
#include "options.hpp"
#include "proc_stats.hpp"
#include "report.hpp"
#include "store_client.hpp"
#include "timing.hpp"
#include "../../csrc/transport/verbs/verbs_transport.hpp"  // verbsRegisteredBytes: what these connections would register over verbs

namespace scale {
namespace {

using roce::str;
using Seconds = std::chrono::duration<double>;

class RankRun {
 public:
  RankRun(const Options& o, int rank, StoreClient& store, RankReport& report)
      : o_(o), rank_(rank), store_(store), report_(report),
        // Long enough for the largest timed call at 1,024 ranks, short enough
        // that a hung collective ends in the core's timeout message (naming
        // the operation and the peer) well before the launcher's wall clock.
        timeout_(std::chrono::seconds(std::max(30, o.timeLimitS / 3))),
        cfg_(roce::Config::fromEnv()) {}

  void run() {
    firstGroup();
    for (const auto& algo : o_.allreduceAlgos) allreduceGroup(algo);
    if (o_.checks != Options::Checks::None)
      for (const auto& algo : o_.gatherAlgos) gatherGroup(algo);
    report_.metrics["peak_rss_kib"] = static_cast<double>(readProcStats().peakRssKiB);
  }

 private:
  // Where this rank is, for the launcher's message if it hangs.
  void stage(const std::string& what) { store_.set(str("stage/", rank_), what); }

  std::unique_ptr<roce::comm::Communicator> form(const roce::Config& cfg) {
    return roce::group::GroupBuilder::join(store_, cfg, rank_, o_.ranks, rank_, timeout_);
  }

  // Another group after the first, noting how long forming it took
  // (repeated formation on one store).
  std::unique_ptr<roce::comm::Communicator> reform(const roce::Config& cfg, const std::string& name) {
    stage("forming the " + name + " group");
    const auto t0 = roce::Clock::now();
    auto c = form(cfg);
    auto& slowest = report_.metrics["reinit_max_s"];
    slowest = std::max(slowest, Seconds(roce::Clock::now() - t0).count());
    return c;
  }

  // A group's end: its peaks noted, its checks counted, and an orderly exit
  // (the neighbours learn it is no failure).
  void finish(std::unique_ptr<roce::comm::Communicator>& c, const Checker& k) {
    notePeaks(*c);
    report_.checksPassed += k.passed();
    c->leaveGracefully();
    c.reset();
  }

  void record(const std::string& name, double value) { report_.metrics[name] = value; }

  // What `connections` of `c` would register over verbs, its pools sized by
  // its network peers as the transport sizes them.
  static double verbsBytes(const roce::comm::Communicator& c, uint64_t connections) {
    return double(roce::transport::verbs::verbsRegisteredBytes(c.config(), static_cast<int>(connections), 1, c.networkPeers()));
  }

  // Descriptors, threads and `c`'s connections (with the verbs memory they
  // would take) at their highest over the run's measuring points; one group
  // exists at a time.
  void notePeaks(roce::comm::Communicator& c) {
    const ProcStats s = readProcStats();
    const auto connections = c.counters().connections.load();
    for (auto [name, value] : {std::pair{"fds_peak", double(s.fds)}, {"threads_peak", double(s.threads)},
                               {"connections_peak", double(connections)},
                               {"verbs_bytes_peak", verbsBytes(c, connections)}}) {
      auto& peak = report_.metrics[name];
      peak = std::max(peak, value);
    }
  }

  // The default settings' group: init time, every collective's checks, and
  // what the rank costs once its few-peer collectives made their connections.
  void firstGroup() {
    stage("start barrier");
    roce::storeBarrier(store_, "harness/start", o_.ranks, roce::Clock::now() + timeout_, timeout_,
                       "the harness's start barrier");
    stage("forming the first group");
    const auto t0 = roce::Clock::now();
    auto c = form(cfg_);
    record("init_s", Seconds(roce::Clock::now() - t0).count());
    // The core's own footprint, before the checks' buffers pass through the heap.
    const ProcStats atInit = readProcStats();
    record("rss_init_kib", double(atInit.rssKiB));
    record("pss_init_kib", double(atInit.pssKiB));
    Checker k(*c, store_, "default", timeout_);
    if (o_.checks != Options::Checks::None) {
      stage("default group: few-peer checks");
      checkFewPeerCollectives(k);
    }
    const ProcStats s = readProcStats();
    const auto connections = c->counters().connections.load();
    record("rss_kib", double(s.rssKiB));
    record("pss_kib", double(s.pssKiB));
    record("shm_segment_kib", double(s.shmSegmentKiB));
    record("fds", s.fds);
    record("threads", s.threads);
    record("connections", double(connections));
    record("verbs_bytes", verbsBytes(*c, connections));
    if (o_.checks == Options::Checks::Full) {
      stage("default group: all-peer checks");
      checkAllPeerCollectives(k);
      const auto all = c->counters().connections.load();
      record("connections_all_peers", double(all));
      record("verbs_bytes_all_peers", verbsBytes(*c, all));
    }
    finish(c, k);
  }

  // A group whose allreduce is forced to `algo`: its checks and timings.
  void allreduceGroup(const std::string& algo) {
    roce::Config cfg = cfg_;
    cfg.algo.allreduce = algo;
    auto c = reform(cfg, "allreduce " + algo);
    Checker k(*c, store_, "allreduce " + algo, timeout_);
    if (o_.checks != Options::Checks::None) {
      stage("allreduce " + algo + ": checks");
      checkAllreduce(k);
      // The algorithm's own peers: the timings below add the barrier's.
      record("connections_allreduce_" + algo, double(c->counters().connections.load()));
    }
    for (size_t bytes : o_.sizes) {
      stage(str("allreduce ", algo, ": timing ", bytesLabel(bytes)));
      const int iters = o_.iterations ? o_.iterations : defaultIterations(bytes);  // at most
      record(str("allreduce_", algo, "_", bytes), timeAllreduce(k, bytes, iters, std::chrono::seconds(o_.budgetS)));
    }
    if (o_.checks == Options::Checks::None)
      record("connections_allreduce_" + algo, double(c->counters().connections.load()));
    finish(c, k);
  }

  // A group whose allgather and reduce_scatter are forced to `algo` (Bruck
  // exists for allgather only: its reduce_scatter stays automatic).
  void gatherGroup(const std::string& algo) {
    roce::Config cfg = cfg_;
    if (!roce::settingValue(algo, cfg.algo.allgather)) throw std::invalid_argument("no allgather algorithm " + algo);
    if (algo != "bruck") roce::settingValue(algo, cfg.algo.reduceScatter);
    auto c = reform(cfg, "allgather " + algo);
    Checker k(*c, store_, "allgather/reduce_scatter " + algo, timeout_);
    stage("allgather/reduce_scatter " + algo + ": checks");
    checkAllgatherAndReduceScatter(k);
    record("connections_allgather_" + algo, double(c->counters().connections.load()));
    finish(c, k);
  }

  const Options& o_;
  const int rank_;
  StoreClient& store_;
  RankReport& report_;
  const std::chrono::milliseconds timeout_;
  const roce::Config cfg_;
};

}  // namespace

int rankMain(const Options& o, int rank, int storePort, pid_t launcher) {
  // A rank never outlives the launcher (it serves the store and enforces the
  // time limit); the check after the prctl covers a launcher already gone.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) return 3;
  setenv("ROCE_PG_SIM_NODE", std::to_string(o.machineOf(rank)).c_str(), 1);
  RankReport report;
  try {
    StoreClient store(storePort, std::chrono::seconds(60));
    try {
      RankRun(o, rank, store, report).run();
    } catch (const std::exception& e) {
      report.error = e.what();
    }
    store.set(str("report/", rank), report.encode());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
  return report.error.empty() ? 0 : 1;
}

}  // namespace scale
