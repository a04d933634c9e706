// Which algorithm a collective uses: forced by ROCE_PG_ALGO* or chosen by
// "auto" from the message size, the group size and the ranks per machine
// (the table is in docs/ARCHITECTURE.md, the measurements behind it in
// docs/PERFORMANCE.md).
#pragma once
#include <cstddef>
#include <cstdint>

#include "team.hpp"

namespace roce {

class Communicator;

enum class Algo : uint8_t { Shm, Ring, Hier, Rd, Rabenseifner, Bruck, Tree, Chain, Allreduce, RsGather };
const char* algoName(Algo a);

// For allreduce (and reduce, built on it) of `bytes` per rank over the whole group.
Algo chooseAllreduce(Communicator& c, size_t bytes);
// For an allreduce among `team` inside the hierarchical algorithm (never Shm or Hier).
Algo chooseFlatAllreduce(Communicator& c, size_t bytes, const Team& team);
// For allgather of `totalBytes` of output per rank: Bruck, Hier or Ring.
Algo chooseAllgather(Communicator& c, size_t totalBytes);
// For reduce-scatter of `totalBytes` of input per rank: Hier or Ring.
Algo chooseReduceScatter(Communicator& c, size_t totalBytes);
// For reduce of `bytes`: an Allreduce on a copy, or RsGather (ring
// reduce-scatter, then the segments to the root) for large messages.
Algo chooseReduce(Communicator& c, size_t bytes);

// For broadcast of `bytes`: binomial Tree, or pipelined Chain for large messages.
Algo chooseBroadcast(Communicator& c, size_t bytes);

// Channels for a ring allreduce of `bytes` per rank: up to the group's
// ROCE_PG_NCHANNELS, each with at least ROCE_PG_ALGO_RING_MIN_BYTES (the size
// from which one ring is worth its latency).
int channelsFor(const Communicator& c, size_t bytes);

// True when the hierarchical algorithms apply: several machines, each with
// the same number (> 1) of the group's ranks.
bool hierApplies(const Communicator& c);

}  // namespace roce
