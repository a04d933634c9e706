// How the ranks of a group learn about each other, in a bounded number of
// store round trips per rank (issue 19): every rank publishes its RankInfo,
// the group's rank 0 (the leader) gathers them in one wait and one multi-get,
// checks what every rank must agree on, and publishes one compact roster - or
// the verdict that the group cannot form, which every rank then raises.
//
// Per rank: 4 round trips (generation, join count, info, roster); the leader
// reads n infos and writes O(n) bytes once. Nothing is polled: waits block in
// the store, in slices after which a probe looks for ranks that moved on to a
// later incarnation (a replaced process), so such a formation fails at once
// with their names instead of timing out.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "incarnation.hpp"
#include "rank_info.hpp"

namespace roce {

class Bootstrap;
struct Config;

struct Roster {
  // Per group rank: nodeId, hostId, tcpHost, tcpPort, pid, nonce, cpus and
  // verbs (the other RankInfo fields are checked by the leader, not copied).
  std::vector<RankInfo> ranks;
  // The transport between machines ("verbs" or "tcp"), decided by the leader
  // from every rank's port probe, or "none" when no rank needs the network.
  std::string network = "none";
  bool forceNetwork = false;  // ROCE_PG_FORCE_NETWORK as the leader set it
  int channels = 1;           // ROCE_PG_NCHANNELS resolved for the group

  std::string encode() const;
  static Roster decode(const std::string& text, int size);
};

// The leader's checks and decisions (throws Invalid with the ranks and the
// variable to fix): algorithm settings equal everywhere, one shared-memory
// layout per machine, a usable network transport, the channel count.
Roster planGroup(const Config& leaderCfg, const std::vector<RankInfo>& infos);

// Collective over the group; `bs` is scoped to this incarnation (`root` is the
// unscoped store, for the generation probes). Returns the roster on every
// rank or throws the leader's verdict on every rank.
Roster exchangeRoster(Bootstrap& bs, Bootstrap& root, const Incarnation& inc, int rank, int size,
                      const RankInfo& me, const Config& cfg, std::chrono::steady_clock::time_point deadline,
                      std::chrono::milliseconds timeout);

}  // namespace roce
