// Hierarchical (2-D) collectives for groups of several machines with L ranks
// each (Topology::evenNodes; select.cpp falls back to the flat algorithms
// otherwise). Shard i of the data belongs to the ranks with local index i: the
// machine-local phases run over shared memory among one machine's ranks, the
// network phase among the N ranks sharing a local index, so all L ranks of a
// machine use the network at once and each carries 1/L of the traffic.
//
// Network bytes per rank (n = the whole vector per rank, N machines):
//   allreduce       2(N-1)/N * n/L   (flat ring: up to 2(p-1)/p * n on the
//                                     ranks at machine boundaries)
//   reduce-scatter  (N-1)/N * n/L    (flat ring: up to (p-1)/p * n)
//   allgather       (N-1)/N * n/L    (flat ring: up to (p-1)/p * n)
#include <algorithm>
#include <cstdint>
#include <memory>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "../common/error.hpp"
#include "algorithms.hpp"
#include "allreduce_registry.hpp"
#include "hier.hpp"
#include "recursive.hpp"
#include "ring.hpp"
#include "select.hpp"
#include "tree.hpp"

namespace roce::algorithms::detail {

namespace {

// Scratch buffers of the overlapped allreduce's concurrent passes (0-2
// belong to the other algorithms).
constexpr int kScratchInMachine = 3, kScratchAcross = 4;

// The three phases one after another over the whole vector; the allreduce
// across machines is the one the cost model picks for the shard (select.hpp).
// Teams of different local indices may pick differently (their shards can
// differ by an element): they never exchange messages with each other.
void hierAllreduceInSequence(Communicator& c, uint64_t tag, void* data, size_t count, DataType t, ReduceOp op) {
  const Topology& topo = c.topology();
  const size_t esz = elementSize(t);
  const Team across(topo.sameLocalIndex, c.rank());
  const RingSegments shards = RingSegments::even(count, static_cast<int>(topo.localRanks.size()));
  ringReduceScatter(c, topo.localRanks, tag, data, shards, t, op);
  char* shard = static_cast<char*>(data) + shards.offset[topo.localIndex] * esz;
  const size_t n = shards.count[topo.localIndex];
  AllreduceAlgorithms::run(chooseAcross(c, n * esz, false), {c, across, tag, shard, n, t, op, true});
  ringAllgather(c, topo.localRanks, tag, data, shards, esz);
}

// Large vectors: cut into pieces and overlapped, so the network is busy
// while the machine's ranks reduce-scatter the next piece and allgather the
// previous one. Piece k moves through three passes (in-machine ring
// reduce-scatter, ring or tree allreduce of this rank's shard across
// machines, in-machine ring allgather); one pass per phase is active at a time
// and all of them advance in one wait. Each (piece, phase) has its own tag, so
// the in-machine passes of two pieces sharing the same neighbours never mix.
// Among the machines this form advances a RingPass or a TreePass: the
// registry's pipelined entries must be exactly those two.
constexpr bool ringAndTreeAloneAdvanceAsPasses() {
  for (int i = 0; i < AllreduceAlgorithms::size; ++i)
    if (AllreduceAlgorithms::pipelines[i] != (AllreduceAlgorithms::ids[i] == Algo::Ring || AllreduceAlgorithms::ids[i] == Algo::Tree))
      return false;
  return true;
}
static_assert(ringAndTreeAloneAdvanceAsPasses(),
              "a new pipelined allreduce entry needs its Pass built in hierAllreduceOverlapped");

void hierAllreduceOverlapped(Communicator& c, void* data, size_t count, DataType t, ReduceOp op, int pieces) {
  const Topology& topo = c.topology();
  const size_t esz = elementSize(t);
  const int local = static_cast<int>(topo.localRanks.size());
  const RingSegments piece = RingSegments::even(count, pieces);
  std::vector<RingSegments> shards;  // per piece, offsets into the whole vector
  for (int k = 0; k < pieces; ++k) {
    shards.push_back(RingSegments::even(piece.count[k], local));
    for (size_t& o : shards.back().offset) o += piece.offset[k];
  }
  std::vector<uint64_t> tags;
  for (int i = 0; i < 3 * pieces; ++i) tags.push_back(c.nextCollectiveTag());
  char* base = static_cast<char*>(data);
  const Team across(topo.sameLocalIndex, c.rank());
  // One choice for all pieces: the first piece's shard is the largest, and
  // the team's members all see the same sizes.
  const size_t pieceShard = shards[0].count[topo.localIndex];
  const bool tree = chooseAcross(c, pieceShard * esz, true) == Algo::Tree;
  const int treeChunks = tree ? treeChunksFor(c, pieceShard * esz, true) : 0;

  std::unique_ptr<Pass> phase[3];
  int begun[3] = {0, 0, 0}, done[3] = {0, 0, 0};
  auto begin = [&](int p, int k) {
    const RingSegments& sh = shards[k];
    char* shard = base + sh.offset[topo.localIndex] * esz;
    const size_t n = sh.count[topo.localIndex];
    if (p == 0)
      phase[0] = std::make_unique<RingPass>(c, topo.localRanks, tags[3 * k], data, sh, t, op, true, false,
                                            kScratchInMachine);
    else if (p == 1 && tree)
      phase[1] = std::make_unique<TreePass>(c, across, tags[3 * k + 1], shard, n, t, op, treeChunks, kScratchAcross);
    else if (p == 1)
      phase[1] = std::make_unique<RingPass>(c, topo.sameLocalIndex, tags[3 * k + 1], shard,
                                            RingSegments::even(n, topo.numNodes), t, op, true, true, kScratchAcross);
    else
      phase[2] = std::make_unique<RingPass>(c, topo.localRanks, tags[3 * k + 2], data, sh, t, op, false, true);
    phase[p]->start();
    ++begun[p];
  };
  c.waitUntil(
      [&] {
        for (int p = 0; p < 3; ++p) {
          // A piece enters a phase once the previous phase finished it.
          if (!phase[p] && begun[p] < pieces && (p == 0 || begun[p] < done[p - 1])) begin(p, begun[p]);
          if (phase[p] && phase[p]->advance()) {
            phase[p].reset();
            ++done[p];
            --p;  // the same phase may take the next piece at once
          }
        }
        return done[2] == pieces;
      },
      [&] {
        return str("the hierarchical allreduce's peers (pieces done: in-machine reduce-scatter ", done[0], "/", pieces,
                   ", across machines ", done[1], "/", pieces, ", in-machine allgather ", done[2], "/", pieces, ")");
      });
}

}  // namespace

void hierAllreduce(Communicator& c, uint64_t tag, void* data, size_t count, DataType t, ReduceOp op) {
  // Pieces whose shards are at least ROCE_PG_ALGO_RING_MIN_BYTES and two
  // chunks, so each pass pipelines (the cost model estimates the same cut).
  const int pieces = hierPiecesFor(c, count * elementSize(t) / c.topology().localRanks.size());
  if (pieces >= 2) return hierAllreduceOverlapped(c, data, count, t, op, pieces);
  hierAllreduceInSequence(c, tag, data, count, t, op);
}

size_t hierBlockIndex(const Topology& topo, int rank) {
  return static_cast<size_t>(topo.localIndexOf[rank]) * topo.numNodes + static_cast<size_t>(topo.nodeOf[rank]);
}

char* hierReduceScatter(Communicator& c, uint64_t tag, void* work, size_t blockCount, DataType t, ReduceOp op) {
  const Topology& topo = c.topology();
  const size_t esz = elementSize(t), nodes = static_cast<size_t>(topo.numNodes);
  const int local = static_cast<int>(topo.localRanks.size());
  // Inside the machine: local index q ends with the machine's sum of shard q.
  ringReduceScatter(c, topo.localRanks, tag, work, RingSegments::strided(local, nodes * blockCount, nodes * blockCount),
                    t, op);
  // Across machines: the node-m rank of the shard's team ends with block m.
  char* shard = static_cast<char*>(work) + static_cast<size_t>(topo.localIndex) * nodes * blockCount * esz;
  ringReduceScatter(c, topo.sameLocalIndex, tag, shard, RingSegments::strided(topo.numNodes, blockCount, blockCount),
                    t, op);
  return shard + static_cast<size_t>(topo.nodeOf[c.rank()]) * blockCount * esz;
}

void hierAllgather(Communicator& c, uint64_t tag, const void* input, void* output, size_t blockBytes) {
  const Topology& topo = c.topology();
  const size_t nodes = static_cast<size_t>(topo.numNodes), bundle = nodes * blockBytes;
  const int local = static_cast<int>(topo.localRanks.size());
  // Bundle q (local index q's blocks from every machine, machines in order).
  char* work = static_cast<char*>(c.scratch(static_cast<size_t>(local) * bundle, 2));
  char* mine = work + static_cast<size_t>(topo.localIndex) * bundle;
  copyBytes(mine + static_cast<size_t>(topo.nodeOf[c.rank()]) * blockBytes, input, blockBytes);
  ringAllgather(c, topo.sameLocalIndex, tag, mine, RingSegments::strided(topo.numNodes, blockBytes, blockBytes), 1);
  ringAllgather(c, topo.localRanks, tag, work, RingSegments::strided(local, bundle, bundle), 1);
  char* out = static_cast<char*>(output);
  for (int m = 0; m < topo.numNodes; ++m)
    for (int q = 0; q < local; ++q)
      copyBytes(out + static_cast<size_t>(topo.nodeRanks[m][q]) * blockBytes,
                work + static_cast<size_t>(q) * bundle + static_cast<size_t>(m) * blockBytes, blockBytes);
}

}  // namespace roce::algorithms::detail

namespace roce::algorithms {
using namespace roce::comm;

void HierAllreduce::run(const AllreduceCall& a) { detail::hierAllreduce(a.c, a.tag, a.data, a.count, a.t, a.op); }

}  // namespace roce::algorithms
