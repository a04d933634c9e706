// Liveness of the ranks of a group, independent of the data transports.
//
// Every rank exchanges records with each of its ring neighbours (the
// node-sorted ring of Topology) over the link between their processes
// (runtime/process_links.hpp: one TCP connection per peer process, shared by
// every group's lifelines), handled on the process's runtime thread
// (runtime/process_runtime.hpp), which blocks in poll() — no cost while
// nothing happens, and it keeps watching while the group's progress thread
// is busy or idle:
//   * a peer process that dies, however it dies (SIGKILL, OOM killer, segfault),
//     closes its links in the kernel: EOF arrives at once, on every transport
//     (shared-memory and verbs peers give no such signal themselves) and across
//     PID namespaces (no pid is compared);
//   * a peer that is alive but silent (SIGSTOP, its machine or link gone) stops
//     sending the heartbeat written every heartbeat timeout / 8 (within
//     100 ms..1 s: every second with the default 20 s): declared dead
//     after ROCE_PG_HEARTBEAT_TIMEOUT_MS;
//   * a failure noticed anywhere (these, or a rank's own timeout or mismatch) is
//     forwarded around the ring in both directions as a FAIL notice, so every
//     rank learns it within a few hops' latency even when the store is gone
//     (rank 0 often hosts it) — a killed rank cuts the ring only at itself;
//   * a group formed from its parent (no leader compared the members'
//     settings) sends its must-share settings (Config::algorithmSettings) to
//     both neighbours first: if any two ranks differ, some neighbouring pair
//     does, and that pair fails the group naming both values (forwarded like
//     any failure); the group's first operation waits for the verdict
//     (awaitSettings), so no operation runs with mismatched algorithms;
//   * when an operation times out, its rank asks every rank for its state
//     (collectStates): each answers once with what it last issued, started
//     and ended (OpProgress), forwarded the same way, so every rank can name
//     the same culprit (verdict.hpp).
// A rank leaving on purpose (shutdown) says BYE first; its EOF is then no failure.
//
// Watched peers (watch()): ranks outside the ring that this rank exchanges
// data with over a transport that shows no departure itself (verbs: its
// queue pairs, once set up, need no socket). They get no heartbeat and no
// notice; a watched rank that shuts the group down says BYE to each of its
// own watched peers (an abort reaches them as the ring's FAIL), and a closed
// link to its process, a BYE or a GONE is
// reported to the group through takeGone() - a peer-level event (the
// requests that involve that rank fail), not the group's failure: a death
// fails the group through its ring neighbours anyway.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../common/backoff.hpp"
#include "../runtime/process_links.hpp"
#include "../runtime/process_runtime.hpp"

namespace roce::liveness {
using namespace roce::runtime;

class Lifeline : public RuntimeService {
 public:
  struct Link {
    int peer;         // group rank
    std::string host; // for messages
    uint64_t nonce;   // the peer's for this group: its records carry it, ours name it
    int link;         // ProcessLinks' link to the peer's process
  };
  // onFailure(reason) runs on the runtime thread, once, for the first failure.
  // `firstContact`: how long a neighbour may stay silent before its first
  // record (a subgroup formed from its parent is dialed before the
  // neighbour creates it, and torch puts no barrier after new_group; the
  // group's timeout). After that, heartbeatTimeoutMs.
  // `settings`: non-empty to compare with the neighbours' (see above).
  // `nonce`: this rank's for the group (what its neighbours' records name).
  Lifeline(int rank, uint64_t nonce, std::string host, std::vector<Link> links, int heartbeatTimeoutMs,
           std::chrono::milliseconds firstContact, std::function<void(const std::string&)> onFailure,
           std::string settings = {});
  ~Lifeline() override;  // leaves with a FAIL notice unless leave() was called
  Lifeline(const Lifeline&) = delete;
  Lifeline& operator=(const Lifeline&) = delete;

  // Thread-safe: tells the neighbours (and through them everybody) that the
  // group failed on this rank. Only the first failure travels.
  void announceFailure(const std::string& why);
  // Orderly exit: BYE to the neighbours, then close. Idempotent.
  void leave();
  // Ranks that said BYE (left on purpose), thread-safe.
  bool departed(int peer) const;
  // Thread-safe: watch `l.peer` from now on (see above); a neighbour is
  // watched in addition to its ring duties. `onGone` (set once, before the
  // first watch) runs on the runtime thread when takeGone() has news.
  void watch(Link l);
  void setGoneHandler(std::function<void()> onGone);
  // Watched ranks that left or died since the last call: (group rank, why).
  std::vector<std::pair<int, std::string>> takeGone();
  // What this rank answers when asked for its state (OpProgress::snapshot).
  // Set before any operation runs; called on the runtime thread.
  void setStateProvider(std::function<std::string()> provider);
  // Asks every rank for its state and waits until all `groupSize` answered or
  // `deadline` passed; returns what arrived (group rank -> snapshot), this
  // rank's own included. Thread-safe; every rank answers once per group, so
  // later calls return the same states.
  std::map<int, std::string> collectStates(int groupSize, Clock::time_point deadline);
  // How a wait for the neighbours' settings ended.
  struct SettingsVerdict {
    bool agreed = false;
    // Why the group failed, when it did (a mismatch, a dead neighbour, this
    // rank's own failure). Read under the lock that recorded it: the caller's
    // own copy of the reason (onFailure) may still be on its way.
    std::string failure;
    // Lifeline records this process dropped over the parking budget since
    // this lifeline began: a neighbour's settings may have been among them.
    uint64_t recordsDropped = 0;
  };
  // Waits until every neighbour's settings arrived and matched (agreed), or
  // the group failed, the lifeline stopped or `deadline` passed. Agreed at
  // once without settings.
  // `abandon` (polled) ends the wait early: the group is being aborted.
  SettingsVerdict awaitSettings(Clock::time_point deadline, const std::function<bool()>& abandon = {});

 private:
  struct Peer;
  Clock::time_point tick(Clock::time_point now) override;
  // The records come from ProcessLinks, pulled in tick(): no descriptors.
  void addPollFds(std::vector<pollfd>&) override {}
  void polled(const pollfd*, size_t) override {}
  void lastWords(bool leaving);
  void failWith(const std::string& why, int exceptLink);
  void sendRecord(Peer& p, uint16_t type, const std::string& text);
  void takeRecords();       // what the links delivered for this group
  void checkLinks();        // a closed link: its peers are gone
  void sendOwnStateOnce();
  void mergeWatched();                           // watch() requests into peers_ (runtime thread)
  void reportGone(Peer& p, const std::string& why);
  void receiveState(const std::string& record, int fromLink);
  // A neighbour's heartbeat says whether it has this rank's settings; sent
  // again while it does not (runtime thread).
  void heartbeatSaysSettings(Peer& p, const std::string& text);
  std::string settingsRecord() const;  // kSettings' text: "<rank> <settings>"
  void receiveSettings(const std::string& record, int fromLink);
  void stopThread();

  const int rank_;
  const uint64_t nonce_;
  const std::string host_;
  const std::chrono::milliseconds heartbeatTimeout_;
  const std::chrono::milliseconds firstContact_;
  std::function<void(const std::string&)> onFailure_;
  std::vector<Peer> peers_;
  ProcessRuntime& runtime_;
  ProcessLinks& links_;
  uint64_t closuresSeen_ = 0;  // ProcessLinks::closures() when the links were last looked at
  uint64_t overBudgetBefore_ = 0;  // ProcessLinks parkedStats().overBudget when this lifeline began
  bool attached_ = false;
  std::chrono::milliseconds interval_;  // between heartbeats
  Clock::time_point nextBeat_, lastRound_;
  mutable std::mutex mu_;
  std::string outgoing_;  // failure to announce (set once)
  std::function<std::string()> stateOf_;
  std::map<int, std::string> states_;  // collected: group rank -> snapshot
  bool stateWanted_ = false;           // collectStates() asked
  bool stateSent_ = false;             // this rank answered (once per group)
  std::condition_variable statesCv_;  // also: settings verdicts
  const std::string settings_;          // empty: no comparison
  size_t settingsMatched_ = 0;          // neighbours whose settings equal ours
  bool failed_ = false;   // a failure was seen or announced: nothing more travels
  std::string failure_;   // its reason, recorded with failed_
  bool stop_ = false, leaving_ = false;
  std::vector<int> departed_;
  size_t neighbours_ = 0;            // peers_[0, neighbours_) are the ring neighbours
  std::vector<Link> watchRequests_;  // from watch(), merged by the runtime thread
  std::vector<std::pair<int, std::string>> gone_;
  std::vector<std::pair<int, uint64_t>> earlyByes_;  // (rank, nonce) said BYE before being watched (runtime thread)
  std::function<void()> onGone_;
};

}  // namespace roce::liveness
