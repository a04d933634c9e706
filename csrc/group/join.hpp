// How the ranks of a group find each other without being misled by what an
// earlier incarnation left in the store.
//
// The store outlives processes: torchrun restarts every worker on the agent's
// store with no per-attempt prefix, and a re-created default group gets the
// same key prefix again, so keys a dead incarnation wrote look exactly like
// fresh ones. Nothing in the environment names an incarnation the same way on
// every rank either: TORCHELASTIC_RESTART_COUNT is counted per agent, is not
// raised by membership changes, and can differ between the ranks of one
// attempt. So freshness is proven by a live connection, as NCCL's bootstrap
// does:
//   * the group's rank 0 (the leader) writes `roce/leader`: its listener's
//     address and a random nonce new for this incarnation;
//   * every other rank reads it, connects, and sends its RankInfo over that
//     connection. A record left by a dead leader refuses the connection (or
//     answers for another nonce): the rank waits for the record to change;
//   * the leader, having heard every rank over a live connection, checks what
//     every rank must agree on and publishes the roster under
//     `roce/<nonce>/roster` - or the verdict, which every rank then raises.
// The nonce names the incarnation: every later store key of the group lives
// under `roce/<nonce>/`. Per rank: two or three store round trips and one
// short connection to the leader; the leader: two writes and n connections,
// one at a time.
#pragma once
#include <chrono>
#include <string>

#include "../membership/rank_info.hpp"
#include "../membership/roster.hpp"

namespace roce {
class Bootstrap;
}
namespace roce::runtime {
class Mailbox;
}
namespace roce {
struct Config;
}
namespace roce::group {
using namespace roce::runtime;
using namespace roce::membership;


struct Joined {
  Roster roster;
  std::string incarnation;  // the leader's nonce in hex: this incarnation's store namespace
};

// Collective over the group. `me` must carry this rank's listener address and
// nonce; `mailbox` is where the front desk leaves connections naming that
// nonce (the leader's joins arrive there).
Joined joinGroup(Bootstrap& store, Mailbox& mailbox, int rank, int size, const RankInfo& me, const Config& cfg,
                 std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout);

}  // namespace roce::group
