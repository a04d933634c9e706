// Alpha-beta-gamma estimates per allreduce algorithm (docs/ALGORITHMS.md
// derives each line). Conventions: n bytes per rank, p ranks on N machines of
// at most L ranks, in node-sorted order, so that partners at distance < L (XOR
// partners, ring neighbours, the lower tree levels) share a machine. A message
// across machines costs netAlpha plus its bytes at the slower of one rank's
// network rate and the machine's port divided among the ranks of the machine
// sending at that moment; a message inside a machine costs shmAlpha plus its
// bytes at the shared-memory rate. Pipelined algorithms (ring, tree) overlap a
// chunk's reduction with the next chunk's transfer; recursive doubling and
// Rabenseifner reduce between rounds.
#include "cost_model.hpp"


#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "allreduce_registry.hpp"

namespace roce::algorithms {
namespace {

constexpr double kNotApplicable = std::numeric_limits<double>::quiet_NaN();
// The tree's smallest chunk: below it, per-message costs outweigh any overlap.
constexpr size_t kTreeMinChunk = 4096;
// Per tree step (one chunk of each tree), a rank that is interior in one tree
// and a leaf in the other sends 3 + 1 chunks and receives as many; over the
// node-sorted order each machine's port carries 6 (worked out in
// docs/ALGORITHMS.md, "Peers").
constexpr int kTreeChunksPerRank = 4, kTreeChunksPerMachine = 6;
// hier's overlapped form cuts the vector into at most this many pieces.
constexpr int kMaxHierPieces = 4;

int ceilLog2(int x) { return x <= 1 ? 0 : std::bit_width(static_cast<unsigned>(x - 1)); }
int floorLog2(int x) { return std::bit_width(static_cast<unsigned>(std::max(1, x))) - 1; }

// Seconds per byte across machines while `concurrent` ranks of every machine send.
double netBeta(const CostConstants& k, const Shape& s, int concurrent) {
  return std::max(k.netBeta, concurrent * s.nicSharers * k.nicBeta);
}

double hop(const CostConstants& k, const Shape& s, bool inside, double bytes, int concurrent) {
  return inside ? k.shmAlpha + bytes * k.shmBeta : k.netAlpha + bytes * netBeta(k, s, concurrent);
}

// Of `levels` rounds whose partner distance doubles from 1 in node-sorted
// order, how many stay inside a machine.
int insideLevels(const Shape& s, int levels) {
  return s.machines == 1 ? levels : std::min(levels, floorLog2(s.perMachine));
}

// Non-powers of two: the first 2r positions pair up and one of each pair
// hands its vector over and gets the result back (recursive.cpp).
double foldCost(const CostConstants& k, const Shape& s, double n) {
  if (std::has_single_bit(static_cast<unsigned>(s.ranks))) return 0;
  const bool inside = s.machines == 1 || s.perMachine >= 2;
  return 2 * hop(k, s, inside, n, 1) + n * k.gamma;
}

// The reduce-scatter and allgather halves of the pipelined ring.
void ringHalves(const CostConstants& k, const Shape& s, double n, double& rs, double& ag) {
  const int p = s.ranks;
  const double seg = n / p, chunk = std::min<double>(seg, static_cast<double>(k.chunkBytes));
  double latency, beta;
  if (s.machines > 1) {
    // A segment's path crosses N machine boundaries per lap; only the ranks at
    // a boundary use the network, one per machine.
    latency = (s.machines - 1) * k.netAlpha + (p - s.machines) * k.shmAlpha;
    beta = std::max(netBeta(k, s, 1), s.perMachine > 1 ? k.shmBeta : 0.0);
  } else {
    latency = (p - 1) * k.shmAlpha;
    beta = k.shmBeta;
  }
  // Per reduce-scatter step: transfer and reduction overlap chunk by chunk.
  rs = latency + (p - 1) * (seg * std::max(beta, k.gamma) + chunk * std::min(beta, k.gamma));
  ag = latency + (p - 1) * seg * beta;
}

struct TreePlan {
  double seconds = 0;
  int chunks = 1;
};

TreePlan bestTree(const CostConstants& k, const Shape& s, double bytes) {
  TreePlan best;
  const int depth = ceilLog2(s.ranks), inside = insideLevels(s, depth);
  const double half = std::ceil(bytes / 2);
  if (depth == 0 || half <= 0) return best;
  const bool net = s.machines > 1;
  const double streamAlpha = net ? k.netAlpha : k.shmAlpha;
  best.seconds = std::numeric_limits<double>::infinity();
  for (int chunks = 1;; chunks *= 2) {
    const double c = std::ceil(half / chunks);
    if (c <= static_cast<double>(k.chunkBytes) || c <= kTreeMinChunk) {
      // The first chunk climbs `depth` levels (a parent receives and reduces
      // two chunks) and comes back down (a parent sends two).
      const double fill = inside * (2 * hop(k, s, true, 2 * c, 1) + 2 * c * k.gamma) +
                          (depth - inside) * (2 * hop(k, s, false, 2 * c, 1) + 2 * c * k.gamma);
      // Then one chunk per tree and step, at the busiest rank's and port's rate.
      const double inMachine = kTreeChunksPerRank * c * k.shmBeta;
      const int portChunks = s.perMachine > 1 ? kTreeChunksPerMachine : kTreeChunksPerRank;
      const double perStep = !net ? inMachine
                                  : std::max({kTreeChunksPerRank * c * k.netBeta, portChunks * c * s.nicSharers * k.nicBeta,
                                              s.perMachine > 1 ? inMachine : 0.0});
      const double t = fill + (chunks - 1) * (streamAlpha + std::max(perStep, 2 * c * k.gamma));
      if (t < best.seconds) best = {t, chunks};
    }
    if (c <= kTreeMinChunk) break;
  }
  return best;
}

using Registry = AllreduceAlgorithms;
// The entries the threshold variables name.
constexpr int kRd = Registry::indexOf(Algo::Rd), kRing = Registry::indexOf(Algo::Ring),
              kHier = Registry::indexOf(Algo::Hier), kRabenseifner = Registry::indexOf(Algo::Rabenseifner);
static_assert(kRd >= 0 && kRing >= 0 && kHier >= 0 && kRabenseifner >= 0);

// Whether the entry called `name` advances as a pass (false for no entry).
bool pipelinedEntry(const std::string& name) {
  const int i = Registry::indexOf(name);
  return i >= 0 && Registry::pipelines[i];
}

// An algorithm that runs among machines, as hier's phase among them.
double costAmongMachines(const CostConstants& k, const Shape& s, double bytes, Algo a) {
  const int i = Registry::indexOf(a);
  return i >= 0 && Registry::amongMachines[i] ? Registry::cost(i, k, s, bytes, a) : kNotApplicable;
}

// The first threshold row that holds among `allowed` candidates, or -1.
// Rows in order: rd up to ROCE_PG_ALGO_RD_MAX_BYTES, hier from
// ROCE_PG_ALGO_HIER_MIN_BYTES, the ring from ROCE_PG_ALGO_RING_MIN_BYTES
// (only where the model could not pick hier: hier does not apply, or
// ROCE_PG_ALGO_HIER_MIN_BYTES is set and said no, so a ring threshold never
// takes a size from hier that the model may still give it).
int thresholdRow(const Config& cfg, const bool allowed[], size_t bytes, const char*& name) {
  if (allowed[kRd] && cfg.algo.rdMaxBytesSet && bytes <= cfg.algo.rdMaxBytes) {
    name = "ROCE_PG_ALGO_RD_MAX_BYTES";
    return kRd;
  }
  if (allowed[kHier] && cfg.algo.hierMinBytesSet && bytes >= cfg.algo.hierMinBytes) {
    name = "ROCE_PG_ALGO_HIER_MIN_BYTES";
    return kHier;
  }
  const bool modelMayPickHier = allowed[kHier] && !cfg.algo.hierMinBytesSet;
  if (allowed[kRing] && !modelMayPickHier && cfg.algo.ringMinBytesSet && bytes >= cfg.algo.ringMinBytes) {
    name = "ROCE_PG_ALGO_RING_MIN_BYTES";
    return kRing;
  }
  return -1;
}

// A set threshold also takes its algorithm out of the model's hands on the
// other side of it: ROCE_PG_ALGO_RD_MAX_BYTES=8K means "rd up to 8 KiB, never
// above".
void dropThresholded(const Config& cfg, bool allowed[]) {
  if (cfg.algo.rdMaxBytesSet) allowed[kRd] = false;
  if (cfg.algo.hierMinBytesSet) allowed[kHier] = false;
  if (cfg.algo.ringMinBytesSet) allowed[kRing] = false;
}

// Threshold rows first, then the cheapest estimate (ties: the earlier candidate).
template <class Estimate>
Choice pick(const Config& cfg, bool allowed[], size_t bytes, Estimate&& estimate) {
  Choice ch;
  ch.estimate.fill(kNotApplicable);
  const int row = thresholdRow(cfg, allowed, bytes, ch.decidedBy);
  if (row >= 0) {
    ch.algo = Registry::ids[row];
    return ch;
  }
  dropThresholded(cfg, allowed);
  int best = -1;
  for (int i = 0; i < Registry::size; ++i) {
    if (!allowed[i]) continue;
    ch.estimate[i] = estimate(i);
    if (!std::isnan(ch.estimate[i]) && (best < 0 || ch.estimate[i] < ch.estimate[best])) best = i;
  }
  ch.algo = Registry::ids[best < 0 ? kRabenseifner : best];  // Rabenseifner always applies
  return ch;
}

}  // namespace

Shape Shape::group(int ranks, int machines, int perMachine, bool even, bool forceNetwork) {
  Shape s;
  s.ranks = ranks;
  s.machines = forceNetwork ? ranks : machines;
  s.perMachine = forceNetwork ? 1 : perMachine;
  s.even = forceNetwork || even;
  return s;
}

Shape Shape::acrossMachines() const {
  Shape s;
  s.ranks = s.machines = machines;
  s.nicSharers = perMachine * nicSharers;
  return s;
}

CostConstants::CostConstants(const Config& cfg)
    : netAlpha(cfg.algo.netAlphaUs * 1e-6),
      netBeta(1 / (cfg.algo.netGBps * 1e9)),
      nicBeta(1 / (cfg.algo.nicGBps * 1e9)),
      shmAlpha(cfg.algo.shmAlphaUs * 1e-6),
      shmBeta(1 / (cfg.algo.shmGBps * 1e9)),
      gamma(1 / (cfg.algo.reduceGBps * 1e9)),
      chunkBytes(cfg.algo.chunkBytes), ringMinBytes(cfg.algo.ringMinBytes),
      acrossMayOverlap(cfg.algo.allreduceAcross == "auto" || pipelinedEntry(cfg.algo.allreduceAcross)) {}

double costRecursiveDoubling(const CostConstants& k, const Shape& s, double n) {
  const int rounds = floorLog2(s.ranks), inside = insideLevels(s, rounds);
  // Every rank exchanges the whole vector each round: all L ranks of a machine cross at once.
  return foldCost(k, s, n) + inside * (hop(k, s, true, n, s.perMachine) + n * k.gamma) +
         (rounds - inside) * (hop(k, s, false, n, s.perMachine) + n * k.gamma);
}

double costRabenseifner(const CostConstants& k, const Shape& s, double n) {
  const int rounds = floorLog2(s.ranks), across = rounds - insideLevels(s, rounds);
  double t = foldCost(k, s, n);
  // Round j of the halving moves n / 2^j to the partner at distance p2 / 2^j:
  // the first `across` rounds (the largest pieces) leave the machine; the
  // allgather retraces them.
  for (int j = 1; j <= rounds; ++j) {
    const double piece = std::ldexp(n, -j);
    t += 2 * hop(k, s, j > across, piece, s.perMachine) + piece * k.gamma;
  }
  return t;
}

double costRing(const CostConstants& k, const Shape& s, double n) {
  double rs, ag;
  ringHalves(k, s, n, rs, ag);
  return rs + ag;
}

double costTree(const CostConstants& k, const Shape& s, double n) { return bestTree(k, s, n).seconds; }

int treeChunks(const CostConstants& k, const Shape& s, size_t bytes) {
  return bestTree(k, s, static_cast<double>(bytes)).chunks;
}

int hierPieces(const CostConstants& k, size_t shardBytes) {
  if (!k.acrossMayOverlap) return 1;
  // Pieces whose shards are at least ROCE_PG_ALGO_RING_MIN_BYTES and two
  // chunks, so each of the three concurrent passes pipelines.
  const size_t minPiece = std::max<size_t>({k.ringMinBytes, 2 * k.chunkBytes, 1});
  return static_cast<int>(std::min<size_t>(kMaxHierPieces, shardBytes / minPiece));
}

double costHier(const CostConstants& k, const Shape& s, double n, Algo across) {
  if (!s.hierApplies()) return kNotApplicable;
  const Shape inMachine = Shape::group(s.perMachine, 1, s.perMachine, true, false);
  const Shape team = s.acrossMachines();
  const int pieces = hierPieces(k, static_cast<size_t>(n / s.perMachine));
  double rs, ag;
  if (pieces < 2) {
    ringHalves(k, inMachine, n, rs, ag);
    return rs + costAmongMachines(k, team, n / s.perMachine, across) + ag;
  }
  const int acrossIndex = Registry::indexOf(across);
  if (acrossIndex < 0 || !Registry::pipelines[acrossIndex]) return kNotApplicable;
  // Three phases on different pieces at once: the slowest sets the pace.
  const double piece = n / pieces;
  ringHalves(k, inMachine, piece, rs, ag);
  const double x = costAmongMachines(k, team, piece / s.perMachine, across);
  return rs + x + ag + (pieces - 1) * std::max({rs, x, ag});
}

int candidateCount() { return Registry::size; }
const char* candidateName(int candidate) { return Registry::names[candidate]; }

double Choice::estimateFor(Algo a) const {
  const int i = Registry::indexOf(a);
  return i < 0 ? kNotApplicable : estimate[i];
}

Choice planAcross(const Config& cfg, const Shape& group, size_t shardBytes, bool overlapped) {
  if (cfg.algo.allreduceAcross != "auto") {
    Choice forced;
    forced.estimate.fill(kNotApplicable);
    forced.decidedBy = "ROCE_PG_ALGO_ALLREDUCE_ACROSS";
    forced.algo = Registry::idOf(cfg.algo.allreduceAcross);
    return forced;
  }
  const CostConstants k(cfg);
  const Shape team = group.acrossMachines();
  bool allowed[Registry::size];
  for (int i = 0; i < Registry::size; ++i)
    allowed[i] = Registry::amongMachines[i] && (!overlapped || Registry::pipelines[i]);
  return pick(cfg, allowed, shardBytes, [&](int i) {
    return Registry::cost(i, k, team, static_cast<double>(shardBytes), Registry::ids[i]);
  });
}

Choice planAllreduce(const Config& cfg, const Shape& group, size_t bytes) {
  const CostConstants k(cfg);
  bool allowed[Registry::size];
  for (int i = 0; i < Registry::size; ++i) allowed[i] = i != kHier || group.hierApplies();
  // hier as hier.cpp will run it: with the algorithm it will pick among the
  // machines for its shard (worked out only when hier is considered).
  bool acrossKnown = false;
  Algo across = Algo::Rd;
  auto acrossForShard = [&] {
    if (!acrossKnown) {
      const size_t shard = bytes / group.perMachine;
      across = planAcross(cfg, group, shard, hierPieces(k, shard) >= 2).algo;
      acrossKnown = true;
    }
    return across;
  };
  Choice ch = pick(cfg, allowed, bytes, [&](int i) {
    return Registry::cost(i, k, group, static_cast<double>(bytes), i == kHier ? acrossForShard() : Registry::ids[i]);
  });
  if (ch.algo == Algo::Hier) ch.across = acrossForShard();
  return ch;
}

double costStagedHostReduce(const Config& cfg, const Shape& s, size_t bytes, bool sharedMemory) {
  const CostConstants k(cfg);
  const double n = static_cast<double>(bytes), share = (s.ranks - 1.0) / s.ranks;
  // shm_allreduce.cpp's two-step: (p-1)/p of the piece copied into the slots
  // and as much out again, the own slice reduced from p inputs.
  if (sharedMemory) return 2 * k.shmAlpha + share * n * (2 * k.shmBeta + k.gamma);
  const Choice ch = planAllreduce(cfg, s, bytes);
  double best = std::numeric_limits<double>::infinity();
  for (double e : ch.estimate)
    if (!std::isnan(e)) best = std::min(best, e);
  return best;
}

bool stagedReducePrefersDevice(const Config& cfg, const Shape& s, size_t bytes, bool sharedMemory) {
  return costStagedDeviceReduce(cfg, s, bytes, sharedMemory) < costStagedHostReduce(cfg, s, bytes, sharedMemory);
}

double costStagedDeviceReduce(const Config& cfg, const Shape& s, size_t bytes, bool sharedMemory) {
  const CostConstants k(cfg);
  const double n = static_cast<double>(bytes), share = (s.ranks - 1.0) / s.ranks;
  const double alpha = sharedMemory ? k.shmAlpha : k.netAlpha, beta = sharedMemory ? k.shmBeta : k.netBeta;
  const double exchange = (s.ranks - 1) * alpha + share * n * beta;  // alltoallv: p-1 messages, flat
  const double pcie = (n + n / s.ranks) / (kDevicePcieGBps * 1e9);   // p rows in, one slice out
  return 2 * exchange + pcie + kDeviceRoundTripUs * 1e-6;
}

}  // namespace roce::algorithms
