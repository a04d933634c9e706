// The cost model behind "auto" allreduce selection (docs/ALGORITHMS.md has the
// formulas, the defaults' reasoning and worked examples). Pure functions of
// the configuration, the group's shape and the message size: every rank
// evaluates them on the same inputs (the constants travel in
// Config::algorithmSettings(), the shape comes from the shared topology), so
// every rank picks the same algorithm without talking to the others.
#pragma once
#include <array>
#include <cstddef>

#include "../common/config.hpp"
#include "select.hpp"

namespace roce::algorithms {

// The ranks an algorithm runs among, as the model sees them.
struct Shape {
  int ranks = 1;        // p
  int machines = 1;     // N
  int perMachine = 1;   // L: the most ranks any machine holds
  bool even = true;     // every machine holds perMachine ranks
  // Ranks of one machine that run the same pattern at the same time on other
  // data (hier's L concurrent teams across machines): they share the port.
  int nicSharers = 1;

  // The whole group. ROCE_PG_FORCE_NETWORK=1 makes every rank its own machine.
  static Shape group(int ranks, int machines, int perMachine, bool even, bool forceNetwork);
  // One rank per machine, L of these teams side by side (hier's network phase).
  Shape acrossMachines() const;
  bool hierApplies() const { return machines > 1 && perMachine > 1 && even; }
};

// Seconds per message and per byte, from the ROCE_PG_ALGO_*_US / *_GBPS variables.
struct CostConstants {
  double netAlpha, netBeta;  // a message across machines; one rank's network rate
  double nicBeta;            // one machine's port, shared by its ranks
  double shmAlpha, shmBeta;  // a message between ranks of one machine
  double gamma;              // reducing one byte into another
  size_t chunkBytes;         // ROCE_PG_CHUNK_BYTES: ring pipelining, the tree's largest chunk
  size_t ringMinBytes;       // hier's overlapped pieces are at least this (per shard)
  bool acrossMayOverlap;     // ROCE_PG_ALGO_ALLREDUCE_ACROSS leaves hier an algorithm that overlaps
  explicit CostConstants(const Config& cfg);
};

// Estimated seconds of one allreduce of `bytes` per rank (NaN where the
// algorithm does not apply, e.g. hier on uneven machines).
double costRecursiveDoubling(const CostConstants& k, const Shape& s, double bytes);
double costRabenseifner(const CostConstants& k, const Shape& s, double bytes);
double costRing(const CostConstants& k, const Shape& s, double bytes);
double costTree(const CostConstants& k, const Shape& s, double bytes);
// hier with `across` (Rd, Rabenseifner, Ring or Tree) among the machines.
double costHier(const CostConstants& k, const Shape& s, double bytes, Algo across);

// Pieces of hier's overlapped form for shards of `shardBytes` (0 or 1: the
// phases run in sequence, as always with rd or rabenseifner forced among the
// machines). hier.cpp cuts the vector by the same rule.
int hierPieces(const CostConstants& k, size_t shardBytes);
// Chunks per half of the pipelined tree for `bytes` per rank among `s`: the
// count the model finds fastest, with chunks of 4 KiB to ROCE_PG_CHUNK_BYTES.
int treeChunks(const CostConstants& k, const Shape& s, size_t bytes);

// What auto picks, and why. `estimate` holds the model's seconds per entry
// of the allreduce registry (allreduce_registry.hpp, in its order; NaN where
// the entry was not a candidate or does not apply).
constexpr int kMaxAllreduceAlgorithms = 8;
struct Choice {
  Algo algo = Algo::Rd;
  Algo across = Algo::Rd;     // with algo == Hier: the algorithm among the machines
  // The ROCE_PG_ALGO_* variable that decided (a threshold row, or the forced
  // ROCE_PG_ALGO_ALLREDUCE_ACROSS), or null: the model did.
  const char* decidedBy = nullptr;
  std::array<double, kMaxAllreduceAlgorithms> estimate{};
  double estimateFor(Algo a) const;  // NaN for an algorithm not in the registry
};
// The registry's entries: how many, and the name of each.
int candidateCount();
const char* candidateName(int candidate);
// Allreduce over the whole group (not forced, not on one machine's shared memory).
Choice planAllreduce(const Config& cfg, const Shape& group, size_t bytes);
// Staged device tensors (csrc/torch/device_reduce.hpp): estimated seconds of
// one piece of `bytes` per rank whose reduction runs on the host (the
// allreduce the group would run: shared memory on one machine, else the
// plan above) or on the device (two flat exchanges of (p-1)/p of the piece,
// plus the piece's rows to the device and the reduced slice back, over PCIe
// at kDevicePcieGBps, plus kDeviceRoundTripUs for the launches and the
// event). The copies every staged piece makes anyway (out once, back once)
// are common to both and left out.
constexpr double kDevicePcieGBps = 25;    // PCIe 4.0 x16, one direction
constexpr double kDeviceRoundTripUs = 20; // launches, an event, the progress thread's first poll
double costStagedHostReduce(const Config& cfg, const Shape& s, size_t bytes, bool sharedMemory);
double costStagedDeviceReduce(const Config& cfg, const Shape& s, size_t bytes, bool sharedMemory);
// ROCE_PG_DEVICE_REDUCE=auto's answer: the device's estimate is the smaller.
bool stagedReducePrefersDevice(const Config& cfg, const Shape& s, size_t bytes, bool sharedMemory);

// The allreduce of hier's shard among the machines: the one
// ROCE_PG_ALGO_ALLREDUCE_ACROSS forces, else any flat algorithm when the
// phases run in sequence, a ring or a tree when they overlap (those two
// advance without blocking).
Choice planAcross(const Config& cfg, const Shape& group, size_t shardBytes, bool overlapped);

}  // namespace roce::algorithms
