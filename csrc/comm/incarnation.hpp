// Which incarnation of a group this is, so that no rank ever reads what an
// earlier incarnation wrote into the same store.
//
// The store outlives processes: torchrun restarts every worker on the agent's
// store, and an application may destroy and re-create the default group (torch
// gives it the same key prefix again). Keys left by a dead incarnation look
// exactly like fresh ones, so every key roce writes lives under
//   roce/<scope>/<generation>/
// where scope names the torchrun attempt (TORCHELASTIC_RUN_ID and
// TORCHELASTIC_RESTART_COUNT, which every worker of an attempt shares) and
// generation counts, per rank slot, the groups formed with this key prefix in
// that scope (a store counter: a process that replaces a dead one continues
// its count, so the ranks of one formation agree on it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace roce {

class Bootstrap;

struct Incarnation {
  std::string scope;
  int64_t generation = 0;
  std::string prefix() const;  // "roce/<scope>/<generation>/"
};

// Takes this rank's next generation in its scope (one store round trip).
Incarnation joinIncarnation(Bootstrap& store, int rank);

// The ranks among `peers` whose slot has moved past this incarnation: their
// process was replaced (or re-created the group) after joining, so they will
// never appear in it. "" when none did. One store round trip per peer: for
// waits that already took a while, on a bounded number of peers.
std::string replacedRanks(Bootstrap& store, const Incarnation& inc, const std::vector<int>& peers);

}  // namespace roce
