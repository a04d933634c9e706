// Which algorithm a collective uses: forced by ROCE_PG_ALGO* or chosen by
// "auto". The allreduce's auto evaluates a cost model per call
// (cost_model.hpp; the table and worked examples are in docs/ALGORITHMS.md);
// the other collectives pick by size thresholds (docs/ARCHITECTURE.md).
#pragma once
#include <cstddef>
#include <cstdint>

#include "team.hpp"

namespace roce::comm {
class Communicator;
}
namespace roce::algorithms {
using namespace roce::comm;

struct Shape;

// What a collective runs, as selection, logs and traces name it. The
// allreduce's algorithms (Rd, Rabenseifner, Ring, Tree, Hier) are the entries
// of allreduce_registry.hpp, which names them; Ring and Hier are also the
// allgather's and reduce-scatter's forms, Shm the single-machine route of
// every collective, Bruck an allgather, Binomial and Chain the broadcast's
// shapes, Allreduce and RsGather the reduce's two strategies.
enum class Algo : uint8_t { Shm, Ring, Hier, Rd, Rabenseifner, Bruck, Tree, Binomial, Chain, Allreduce, RsGather };
const char* algoName(Algo a);

// For allreduce (and reduce, built on it) of `bytes` per rank over the whole group.
Algo chooseAllreduce(Communicator& c, size_t bytes);
// For hier's allreduce of a shard of `bytes` among the machines: Rd,
// Rabenseifner, Ring or Tree; only Ring or Tree when `overlapped` (hier's
// phases advancing together on pieces need passes that do not block).
Algo chooseAcross(Communicator& c, size_t bytes, bool overlapped);
// The group as the cost model sees it (ranks, machines, ranks per machine).
Shape groupShape(const Communicator& c);
// Chunks per half for the tree allreduce of `bytes` per rank among the whole
// group, or (acrossMachines) among hier's team of one rank per machine.
int treeChunksFor(const Communicator& c, size_t bytes, bool acrossMachines);
// Pieces of hier's overlapped allreduce for shards of `shardBytes` (< 2: in sequence).
int hierPiecesFor(const Communicator& c, size_t shardBytes);
// For allgather of `totalBytes` of output per rank: Shm (the whole group on
// one machine), Bruck, Hier or Ring.
Algo chooseAllgather(Communicator& c, size_t totalBytes);
// For reduce-scatter of `totalBytes` of input per rank: Shm, Hier or Ring.
Algo chooseReduceScatter(Communicator& c, size_t totalBytes);
// For reduce of `bytes`: an Allreduce on a copy, or RsGather (ring
// reduce-scatter, then the segments to the root) for large messages.
Algo chooseReduce(Communicator& c, size_t bytes);

// For broadcast of `bytes`: Shm, Binomial tree, or pipelined Chain for large messages.
Algo chooseBroadcast(Communicator& c, size_t bytes);

// Channels for a ring allreduce of `bytes` per rank: up to the group's
// ROCE_PG_NCHANNELS, each with at least ROCE_PG_ALGO_RING_MIN_BYTES (the size
// from which one ring is worth its latency).
int channelsFor(const Communicator& c, size_t bytes);

// Staged device tensors: whether the reductions of a piece of `bytes` per
// rank run on the device (ROCE_PG_DEVICE_REDUCE=device, or auto where the cost
// model's costStagedDeviceReduce beats costStagedHostReduce). A pure function
// of the configuration, the group's shape and the size: every rank decides alike.
bool reduceStagedOnDevice(const Communicator& c, size_t bytes);

// True when the hierarchical algorithms apply: several machines, each with
// the same number (> 1) of the group's ranks.
bool hierApplies(const Communicator& c);

}  // namespace roce::algorithms
