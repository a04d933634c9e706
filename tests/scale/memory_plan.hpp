// Which timed allreduce sizes this machine can hold for every rank at once.
#pragma once
#include <string>
#include <vector>

namespace scale {

struct Options;

// Drops from o.sizes those whose buffers would not fit and returns, per
// dropped size, a line saying why. A rank's allreduce of S bytes holds its
// S-byte vector and up to 2 S of the algorithm's scratch and early arrivals
// (recursive doubling's partner vector, a transport buffering what came
// before the receive), so the run needs about ranks x 3 S.
std::vector<std::string> dropSizesThatDoNotFit(Options& o);

}  // namespace scale
