// One cross-rank verdict when a group hangs: from every rank's OpProgress
// snapshot (collected over the lifelines, lifeline.hpp), which ranks are
// behind the others and where the rest wait. Every rank that collects the
// same snapshots computes the same text, so every error of a hung job names
// the same culprit:
//   "rank 2 last completed allreduce #3 and has called nothing for 10.0 s;
//    ranks 0, 1, 3 wait in allreduce #4"
#pragma once
#include <map>
#include <string>
#include <vector>

namespace roce::liveness {

// `states`: group rank -> OpProgress::snapshot() text; `size`: the group's
// ranks (those missing from `states` did not answer). Empty when there is
// nothing to say (no snapshot parsed).
std::string formatVerdict(const std::map<int, std::string>& states, int size);

// "0-3, 5, 7-9": ascending ranks, runs collapsed (1,000-rank jobs).
std::string rankList(const std::vector<int>& ranks);

}  // namespace roce::liveness
