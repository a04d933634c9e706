// Forms a group and hands over a ready Communicator: the ranks' information
// gathered (joining the leader, join.hpp) or derived from the parent's roster
// (membership/roster.hpp), then lifelines to the ring neighbours, shared
// memory among the ranks of this machine, and the network transport for the
// other peers. The communicator itself only routes, posts and waits; what
// forming needs of its insides it reaches as a friend, so that nothing else
// can assemble a half-formed one.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../comm/communicator.hpp"

namespace roce::group {
using namespace roce::comm;

class GroupBuilder {
 public:
  // Collective over the group: joins the group's leader, which hands out the
  // roster. `globalRank` places the rank on simulated nodes. `store` is used
  // only while forming (keys under the leader's incarnation prefix).
  static std::unique_ptr<Communicator> join(Bootstrap& store, const Config& cfg, int rank, int size, int globalRank,
                                            std::chrono::milliseconds timeout);
  // A subgroup of `parent` with no join: its members are the parent's ranks
  // `parentRanks` (this rank among them, at `rank`), the roster is derived
  // from the parent's (deriveRoster, named by `groupName`, which every member
  // passes alike). Collective over the members only. `store` is used for the
  // members' shared-memory names, if any share a machine. `cfg` is read at the
  // subgroup's creation, as for any group (a job may set ROCE_PG_ALGO* per
  // group); with no leader, the ring neighbours compare it over their
  // lifelines, and members that differ fail the first operation (README).
  // What derive takes from the parent, copied first (parentView, fast): the
  // parent may be aborted, and its communicator freed, while the subgroup
  // forms.
  struct ParentView {
    Roster roster;
    int rank = -1;
    std::vector<std::shared_ptr<VerbsDevice>> rails;
  };
  static ParentView parentView(const Communicator& parent);
  static std::unique_ptr<Communicator> derive(const ParentView& parent, Bootstrap& store, const Config& cfg,
                                              int rank, const std::vector<int>& parentRanks,
                                              const std::string& groupName, std::chrono::milliseconds timeout);

 private:
  // The steps after the roster is known, shared by both.
  static void form(Communicator& c, Bootstrap& store, Roster roster, const std::string& incarnation, int rank,
                   Clock::time_point deadline);
  // `probe(peer)` returns a check that throws when `peer` will never connect.
  static void connectLifelines(Communicator& c, const std::vector<TcpEndpoint>& eps,
                               const std::vector<uint64_t>& nonces, Clock::time_point deadline,
                               const std::function<std::function<void()>(int)>& probe);
  // ROCE_PG_CONNECT=eager: connects every network peer before init returns.
  static void connectAll(Communicator& c, const std::vector<bool>& viaNet, Clock::time_point deadline);
};

}  // namespace roce::group
