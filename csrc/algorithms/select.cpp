#include "select.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../comm/communicator.hpp"
#include "../common/log.hpp"
#include "allreduce_registry.hpp"
#include "cost_model.hpp"

namespace roce::algorithms {
using namespace roce::comm;

namespace {

enum Kind { kAllreduce = 0, kAllreduceAcross = 1, kAllgather = 2, kBroadcast = 3, kReduceScatter = 4, kReduce = 5 };
const char* kKindNames[] = {"allreduce", "allreduce across machines (inside hier)", "allgather", "broadcast",
                            "reduce_scatter", "reduce"};

// Logs the first use of each (kind, algorithm) at INFO, on the group's rank 0.
// After that a choice costs one bit test: nothing is formatted per call (the
// reason is a string or a callable that builds one, called only here).
template <class Why>
Algo announce(Communicator& c, Kind kind, Algo a, size_t bytes, Why&& why) {
  AlgorithmState& state = c.algorithmState();
  if (kind != kAllreduceAcross) state.last = algoName(a);  // hier's inner choice stays hier
  const uint32_t bit = 1u << static_cast<int>(a);
  if (state.logged[kind] & bit) return a;
  state.logged[kind] |= bit;
  if (c.rank() == 0) {
    std::string reason;
    if constexpr (std::is_invocable_v<Why>) reason = why();
    else reason = why;
    ROCE_INFO(kKindNames[kind], " uses ", algoName(a), " (first at ", bytes, " bytes per rank, ", c.size(),
              " ranks on ", c.topology().numNodes, " machine(s)): ", reason);
  }
  return a;
}

// "auto: ..." for the log: the variable that decided, or the model's estimates.
std::string explain(const Choice& ch) {
  if (ch.decidedBy) return str("auto: decided by ", ch.decidedBy);
  std::string s = "auto: cost model (estimates";
  for (int i = 0; i < candidateCount(); ++i)
    if (!std::isnan(ch.estimate[i])) s += str(" ", candidateName(i), " ", ch.estimate[i] * 1e6, " us");
  if (ch.algo == Algo::Hier) s += str("; among the machines: ", algoName(ch.across));
  return s + ")";
}

}  // namespace

const char* algoName(Algo a) {
  if (const int i = AllreduceAlgorithms::indexOf(a); i >= 0) return AllreduceAlgorithms::names[i];
  switch (a) {
    case Algo::Shm: return "shm";
    case Algo::Bruck: return "bruck";
    case Algo::Binomial: return "binomial";
    case Algo::Chain: return "chain";
    case Algo::Allreduce: return "allreduce";
    case Algo::RsGather: return "reduce_scatter+gather";
    default: return "?";  // the allreduce entries are named above
  }
}

int channelsFor(const Communicator& c, size_t bytes) {
  const size_t perChannel = std::max<size_t>(1, c.config().algo.ringMinBytes);
  return static_cast<int>(std::clamp<size_t>(bytes / perChannel, 1, std::max(1, c.channels())));
}

bool hierApplies(const Communicator& c) {
  const Topology& t = c.topology();
  return t.numNodes > 1 && t.localRanks.size() > 1 && t.evenNodes;
}

Shape groupShape(const Communicator& c) {
  const Topology& t = c.topology();
  size_t perMachine = t.localRanks.size();  // per call: no loop over the machines where they are even
  if (!t.evenNodes)
    for (const auto& ranks : t.nodeRanks) perMachine = std::max(perMachine, ranks.size());
  return Shape::group(t.size, t.numNodes, static_cast<int>(perMachine), t.evenNodes, c.config().placement.forceNetwork);
}

int treeChunksFor(const Communicator& c, size_t bytes, bool acrossMachines) {
  const Shape g = groupShape(c);
  return treeChunks(CostConstants(c.config()), acrossMachines ? g.acrossMachines() : g, bytes);
}

int hierPiecesFor(const Communicator& c, size_t shardBytes) {
  return hierPieces(CostConstants(c.config()), shardBytes);
}

Algo chooseAllreduce(Communicator& c, size_t bytes) {
  const Config& cfg = c.config();
  if (cfg.algo.allreduce != "auto") {
    // The settings accept only the registry's names (allreduce_settings.cpp).
    const Algo forced = AllreduceAlgorithms::idOf(cfg.algo.allreduce);
    // Hier needs the same number of ranks on every machine (the shard of
    // local index i is reduced among the i-th ranks of all machines). The
    // documented fallback is the flat choice, not an error: one variable can
    // then be set for a whole job whose subgroups differ.
    if (forced == Algo::Hier && !c.topology().evenNodes) {
      const Choice ch = planAllreduce(cfg, groupShape(c), bytes);  // hier does not apply: a flat choice
      return announce(c, kAllreduce, ch.algo, bytes, [&] {
        return "ROCE_PG_ALGO_ALLREDUCE=hier does not apply (machines have different numbers of ranks), "
               "fallback to the flat choice of " + explain(ch);
      });
    }
    return announce(c, kAllreduce, forced, bytes, "forced by ROCE_PG_ALGO_ALLREDUCE / ROCE_PG_ALGO");
  }
  if (c.nodeShm()) return announce(c, kAllreduce, Algo::Shm, bytes, "auto: the whole group shares one machine's memory");
  const Choice ch = planAllreduce(cfg, groupShape(c), bytes);
  return announce(c, kAllreduce, ch.algo, bytes, [&] { return explain(ch); });
}

bool reduceStagedOnDevice(const Communicator& c, size_t bytes) {
  const Config& cfg = c.config();
  if (c.size() < 2 || cfg.device.reduce == DeviceReduce::Host) return false;
  if (cfg.device.reduce == DeviceReduce::Device) return true;
  return stagedReducePrefersDevice(cfg, groupShape(c), bytes, c.nodeShm() != nullptr);
}

Algo chooseAcross(Communicator& c, size_t bytes, bool overlapped) {
  const Choice ch = planAcross(c.config(), groupShape(c), bytes, overlapped);
  return announce(c, kAllreduceAcross, ch.algo, bytes, [&] { return explain(ch); });
}

namespace {

// Hierarchical or flat ring, for the collectives that have both forms:
// forced by `setting` (Ring / Hier, hier falling back to the ring where it
// does not apply), or by layout and size.
template <class Shape>
Algo hierOrRing(Communicator& c, Kind kind, Shape setting, size_t bytes, const char* forcedWhy,
                const char* fallbackWhy) {
  if (setting == Shape::Ring) return announce(c, kind, Algo::Ring, bytes, forcedWhy);
  if (setting == Shape::Hier)
    return hierApplies(c) ? announce(c, kind, Algo::Hier, bytes, forcedWhy)
                          : announce(c, kind, Algo::Ring, bytes, fallbackWhy);
  if (hierApplies(c) && bytes >= c.config().algo.hierMinBytes)
    return announce(c, kind, Algo::Hier, bytes,
                    "auto: several machines with the same number of ranks, at least ROCE_PG_ALGO_HIER_MIN_BYTES");
  return announce(c, kind, Algo::Ring, bytes, "auto");
}

// The shared-memory route of allgather, broadcast and reduce_scatter
// (shm_copies.cpp, shm_reduce_scatter.cpp): where the whole group shares one
// machine's memory (as for the shm allreduce), unless `setting` forces a
// point-to-point algorithm. Forced Shm elsewhere falls back to auto.
template <class Shape>
bool shmRoute(const Communicator& c, Shape setting) {
  return c.nodeShm() && c.size() > 1 && (setting == Shape::Auto || setting == Shape::Shm);
}

template <class Shape>
Algo announceShm(Communicator& c, Kind kind, Shape setting, size_t bytes, const char* forcedWhy) {
  return announce(c, kind, Algo::Shm, bytes,
                  setting == Shape::Shm ? forcedWhy : "auto: the whole group shares one machine's memory");
}

}  // namespace

Algo chooseAllgather(Communicator& c, size_t totalBytes) {
  const Config& cfg = c.config();
  // Device memory (GPUDirect) is never touched by the CPU: Bruck and hier
  // copy blocks through host scratch memory, the ring moves each by RDMA.
  // Every rank of a collective chose the direct path alike.
  if (c.deviceBuffers())
    return announce(c, kAllgather, Algo::Ring, totalBytes, "device memory (GPUDirect): the ring, which copies no block");
  if (shmRoute(c, cfg.algo.allgather))
    return announceShm(c, kAllgather, cfg.algo.allgather, totalBytes, "forced by ROCE_PG_ALGO_ALLGATHER");
  if (cfg.algo.allgather == AllgatherShape::Bruck)
    return announce(c, kAllgather, Algo::Bruck, totalBytes, "forced by ROCE_PG_ALGO_ALLGATHER");
  const bool automatic = cfg.algo.allgather == AllgatherShape::Auto || cfg.algo.allgather == AllgatherShape::Shm;
  if (automatic && c.size() > 2 && totalBytes <= cfg.algo.bruckMaxBytes)
    return announce(c, kAllgather, Algo::Bruck, totalBytes, "auto: at most ROCE_PG_ALGO_BRUCK_MAX_BYTES");
  return hierOrRing(c, kAllgather, cfg.algo.allgather, totalBytes, "forced by ROCE_PG_ALGO_ALLGATHER",
                    "ROCE_PG_ALGO_ALLGATHER=hier does not apply (one machine, one rank per machine, or machines "
                    "with different numbers of ranks), fallback to ring");
}

Algo chooseReduceScatter(Communicator& c, size_t totalBytes) {
  const ReduceScatterShape setting = c.config().algo.reduceScatter;
  if (shmRoute(c, setting))
    return announceShm(c, kReduceScatter, setting, totalBytes, "forced by ROCE_PG_ALGO_REDUCE_SCATTER");
  return hierOrRing(c, kReduceScatter, setting, totalBytes,
                    "forced by ROCE_PG_ALGO_REDUCE_SCATTER",
                    "ROCE_PG_ALGO_REDUCE_SCATTER=hier does not apply (one machine, one rank per machine, or machines "
                    "with different numbers of ranks), fallback to ring");
}

Algo chooseReduce(Communicator& c, size_t bytes) {
  // On one machine the shared-memory allreduce is cheaper than any message
  // pattern; two ranks gain nothing (the segment sent to the root is the
  // allreduce's second half).
  if (c.nodeShm() || c.size() <= 2 || bytes < c.config().algo.ringMinBytes)
    return announce(c, kReduce, Algo::Allreduce, bytes,
                    "one machine, two ranks, or below ROCE_PG_ALGO_RING_MIN_BYTES: an allreduce on a copy");
  return announce(c, kReduce, Algo::RsGather, bytes, "auto: at least ROCE_PG_ALGO_RING_MIN_BYTES");
}

Algo chooseBroadcast(Communicator& c, size_t bytes) {
  const BroadcastShape setting = c.config().algo.broadcast;
  if (shmRoute(c, setting))
    return announceShm(c, kBroadcast, setting, bytes, "forced by ROCE_PG_ALGO_BROADCAST");
  if (setting == BroadcastShape::Binomial || setting == BroadcastShape::Chain)
    return announce(c, kBroadcast, setting == BroadcastShape::Chain ? Algo::Chain : Algo::Binomial, bytes,
                    "forced by ROCE_PG_ALGO_BROADCAST");
  if (c.size() > 2 && bytes >= c.config().algo.ringMinBytes)
    return announce(c, kBroadcast, Algo::Chain, bytes, "at least ROCE_PG_ALGO_RING_MIN_BYTES");
  return announce(c, kBroadcast, Algo::Binomial, bytes, "below ROCE_PG_ALGO_RING_MIN_BYTES");
}

}  // namespace roce::algorithms
