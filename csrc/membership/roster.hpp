// What every rank of a group knows about every other after formation (see
// join.hpp for how it is built): where each rank runs, how to reach it, and
// what the leader decided for all (the network transport, the channel count)
// after checking what every rank must agree on.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "rank_info.hpp"

namespace roce {
struct Config;
}
namespace roce::membership {


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
  // decode(), or the leader's verdict ("error <kind>\n<message>") thrown as
  // the Error it was.
  static Roster decodeOrThrow(const std::string& text, int size);
};

// The leader's checks and decisions (throws Invalid with the ranks and the
// variable to fix): algorithm settings equal everywhere, one shared-memory
// layout per machine, a usable network transport, the channel count.
Roster planGroup(const Config& leaderCfg, const std::vector<RankInfo>& infos);

// A subgroup's roster from its parent's, with no join: the members
// are the parent ranks `parentRanks` in order, and each member's nonce is
// derivedNonce(its parent nonce, `groupName`), the same on every rank, so
// every member computes the same roster and the front desk can route the
// subgroup's connections by it. The parent checked everything planGroup
// checks; the network transport is the parent's (or none if the members
// share a machine); the channel count is recomputed for the members.
Roster deriveRoster(const Config& cfg, const Roster& parent, const std::vector<int>& parentRanks,
                    const std::string& groupName);
uint64_t derivedNonce(uint64_t parentNonce, const std::string& groupName);

}  // namespace roce::membership
