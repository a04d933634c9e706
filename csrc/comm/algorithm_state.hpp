// What the collective algorithms keep between operations of one group. The
// communicator owns it (one per group, touched by the one thread that runs
// the group's operations) so that every algorithm of that group sees the
// same counters; the algorithms alone read and write it.
#pragma once
#include <cstdint>

namespace roce::comm {

struct AlgorithmState {
  // Shared-memory allreduce and barrier: the barrier's generation, and the
  // call count whose parity picks the slot buffer (shm_call.hpp).
  uint64_t shmBarrierGeneration = 0;
  uint64_t shmIteration = 0;
  // Which (kind, algorithm) choices were logged already (a bit per
  // algorithm, algorithms/select.cpp), so INFO says each once.
  uint32_t logged[8] = {};
  // The algorithm the running operation chose (a literal; null if it chose
  // none): the engine resets it before each operation and puts it in the
  // operation's trace entry.
  const char* last = nullptr;
};

}  // namespace roce::comm
