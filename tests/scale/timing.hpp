// How long an allreduce takes on this rank.
#pragma once
#include <chrono>
#include <cstddef>

namespace scale {

class Checker;

// Seconds per allreduce of `bytes` (int64 MAX: idempotent, so back-to-back
// calls keep one exact reference), averaged over calls that start together
// after a barrier; the result of the last call is checked. One warm-up call
// first makes the connections the algorithm needs and sizes the run: as many
// calls as fit in `budget` at the slowest rank's warm-up pace, at least one,
// at most `maxIters` (every rank gets the same count from an allreduce).
double timeAllreduce(Checker& k, size_t bytes, int maxIters, std::chrono::milliseconds budget);

// Calls to average over at most by default: fewer for larger messages.
int defaultIterations(size_t bytes);

}  // namespace scale
