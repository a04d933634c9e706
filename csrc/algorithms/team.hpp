// The ranks one algorithm runs among: the whole group, one machine's ranks, or
// the ranks with the same local index on every machine (the hierarchical
// allreduce runs the flat algorithms on the latter two). Positions, not group
// ranks, are what the algorithms' arithmetic (ring neighbours, XOR partners)
// works on.
#pragma once
#include <algorithm>
#include <vector>

namespace roce::algorithms {

struct Team {
  std::vector<int> ranks;  // group ranks, in the algorithm's order
  int index = 0;           // this rank's position in `ranks`

  Team() = default;
  Team(std::vector<int> r, int me) : ranks(std::move(r)) {
    index = static_cast<int>(std::find(ranks.begin(), ranks.end(), me) - ranks.begin());
  }
  int size() const { return static_cast<int>(ranks.size()); }
  int rankAt(int pos) const { return ranks[pos]; }
};

}  // namespace roce::algorithms
