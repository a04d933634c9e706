#include "select.hpp"

#include <algorithm>

#include "../comm/communicator.hpp"
#include "../common/log.hpp"

namespace roce {
namespace {

enum Kind { kAllreduce = 0, kAllreduceAcross = 1, kAllgather = 2, kBroadcast = 3, kReduceScatter = 4, kReduce = 5 };
const char* kKindNames[] = {"allreduce", "allreduce across machines (inside hier)", "allgather", "broadcast",
                            "reduce_scatter", "reduce"};

// Logs the first use of each (kind, algorithm) at INFO, on the group's rank 0.
// After that a choice costs one bit test: nothing is formatted per call.
Algo announce(Communicator& c, Kind kind, Algo a, size_t bytes, const char* why) {
  const uint32_t bit = 1u << static_cast<int>(a);
  if (c.algoLogged[kind] & bit) return a;
  c.algoLogged[kind] |= bit;
  if (c.rank() == 0)
    ROCE_INFO(kKindNames[kind], " uses ", algoName(a), " (first at ", bytes, " bytes per rank, ", c.size(),
              " ranks on ", c.topology().numNodes, " machine(s)): ", why);
  return a;
}

Algo byName(const std::string& s) {
  if (s == "ring") return Algo::Ring;
  if (s == "hier") return Algo::Hier;
  if (s == "rd") return Algo::Rd;
  if (s == "bruck") return Algo::Bruck;
  return Algo::Rabenseifner;  // config.cpp admits nothing else
}

Algo flatBySize(const Config& cfg, size_t bytes) {
  if (bytes <= cfg.rdMaxBytes) return Algo::Rd;
  if (bytes < cfg.ringMinBytes) return Algo::Rabenseifner;
  return Algo::Ring;
}

}  // namespace

const char* algoName(Algo a) {
  switch (a) {
    case Algo::Shm: return "shm";
    case Algo::Ring: return "ring";
    case Algo::Hier: return "hier";
    case Algo::Rd: return "rd";
    case Algo::Rabenseifner: return "rabenseifner";
    case Algo::Bruck: return "bruck";
    case Algo::Tree: return "tree";
    case Algo::Chain: return "chain";
    case Algo::Allreduce: return "allreduce";
    case Algo::RsGather: return "reduce_scatter+gather";
  }
  return "?";
}

int channelsFor(const Communicator& c, size_t bytes) {
  const size_t perChannel = std::max<size_t>(1, c.config().ringMinBytes);
  return static_cast<int>(std::clamp<size_t>(bytes / perChannel, 1, std::max(1, c.channels())));
}

bool hierApplies(const Communicator& c) {
  const Topology& t = c.topology();
  return t.numNodes > 1 && t.localRanks.size() > 1 && t.evenNodes;
}

Algo chooseAllreduce(Communicator& c, size_t bytes) {
  const Config& cfg = c.config();
  if (cfg.algoAllreduce != "auto") {
    const Algo forced = byName(cfg.algoAllreduce);
    // Hier needs the same number of ranks on every machine (the shard of
    // local index i is reduced among the i-th ranks of all machines). The
    // documented fallback is the flat choice, not an error: one variable can
    // then be set for a whole job whose subgroups differ.
    if (forced == Algo::Hier && !c.topology().evenNodes)
      return announce(c, kAllreduce, flatBySize(cfg, bytes), bytes,
                      "ROCE_PG_ALGO_ALLREDUCE=hier does not apply (machines have different numbers of ranks), "
                      "fallback to the size-based flat choice");
    return announce(c, kAllreduce, forced, bytes, "forced by ROCE_PG_ALGO_ALLREDUCE / ROCE_PG_ALGO");
  }
  if (c.nodeShm()) return announce(c, kAllreduce, Algo::Shm, bytes, "auto: the whole group shares one machine's memory");
  if (bytes <= cfg.rdMaxBytes)
    return announce(c, kAllreduce, Algo::Rd, bytes, "auto: at most ROCE_PG_ALGO_RD_MAX_BYTES");
  if (hierApplies(c) && bytes >= cfg.hierMinBytes)
    return announce(c, kAllreduce, Algo::Hier, bytes,
                    "auto: several machines with the same number of ranks, at least ROCE_PG_ALGO_HIER_MIN_BYTES");
  if (bytes < cfg.ringMinBytes)
    return announce(c, kAllreduce, Algo::Rabenseifner, bytes, "auto: below ROCE_PG_ALGO_RING_MIN_BYTES");
  return announce(c, kAllreduce, Algo::Ring, bytes, "auto: at least ROCE_PG_ALGO_RING_MIN_BYTES");
}

Algo chooseFlatAllreduce(Communicator& c, size_t bytes, const Team& team) {
  (void)team;
  return announce(c, kAllreduceAcross, flatBySize(c.config(), bytes), bytes, "auto, by the shard's size");
}

namespace {

// Hierarchical or flat ring, for the collectives that have both forms:
// forced by `setting` ("ring" / "hier", hier falling back to the ring where it
// does not apply), or by layout and size.
Algo hierOrRing(Communicator& c, Kind kind, const std::string& setting, size_t bytes, const char* forcedWhy,
                const char* fallbackWhy) {
  if (setting == "ring") return announce(c, kind, Algo::Ring, bytes, forcedWhy);
  if (setting == "hier")
    return hierApplies(c) ? announce(c, kind, Algo::Hier, bytes, forcedWhy)
                          : announce(c, kind, Algo::Ring, bytes, fallbackWhy);
  if (hierApplies(c) && bytes >= c.config().hierMinBytes)
    return announce(c, kind, Algo::Hier, bytes,
                    "auto: several machines with the same number of ranks, at least ROCE_PG_ALGO_HIER_MIN_BYTES");
  return announce(c, kind, Algo::Ring, bytes, "auto");
}

}  // namespace

Algo chooseAllgather(Communicator& c, size_t totalBytes) {
  const Config& cfg = c.config();
  if (cfg.algoAllgather == "bruck")
    return announce(c, kAllgather, Algo::Bruck, totalBytes, "forced by ROCE_PG_ALGO_ALLGATHER");
  if (cfg.algoAllgather == "auto" && c.size() > 2 && totalBytes <= cfg.bruckMaxBytes)
    return announce(c, kAllgather, Algo::Bruck, totalBytes, "auto: at most ROCE_PG_ALGO_BRUCK_MAX_BYTES");
  return hierOrRing(c, kAllgather, cfg.algoAllgather, totalBytes, "forced by ROCE_PG_ALGO_ALLGATHER",
                    "ROCE_PG_ALGO_ALLGATHER=hier does not apply (one machine, one rank per machine, or machines "
                    "with different numbers of ranks), fallback to ring");
}

Algo chooseReduceScatter(Communicator& c, size_t totalBytes) {
  return hierOrRing(c, kReduceScatter, c.config().algoReduceScatter, totalBytes,
                    "forced by ROCE_PG_ALGO_REDUCE_SCATTER",
                    "ROCE_PG_ALGO_REDUCE_SCATTER=hier does not apply (one machine, one rank per machine, or machines "
                    "with different numbers of ranks), fallback to ring");
}

Algo chooseReduce(Communicator& c, size_t bytes) {
  // On one machine the shared-memory allreduce is cheaper than any message
  // pattern; two ranks gain nothing (the segment sent to the root is the
  // allreduce's second half).
  if (c.nodeShm() || c.size() <= 2 || bytes < c.config().ringMinBytes)
    return announce(c, kReduce, Algo::Allreduce, bytes,
                    "one machine, two ranks, or below ROCE_PG_ALGO_RING_MIN_BYTES: an allreduce on a copy");
  return announce(c, kReduce, Algo::RsGather, bytes, "auto: at least ROCE_PG_ALGO_RING_MIN_BYTES");
}

Algo chooseBroadcast(Communicator& c, size_t bytes) {
  if (c.size() > 2 && bytes >= c.config().ringMinBytes)
    return announce(c, kBroadcast, Algo::Chain, bytes, "at least ROCE_PG_ALGO_RING_MIN_BYTES");
  return announce(c, kBroadcast, Algo::Tree, bytes, "below ROCE_PG_ALGO_RING_MIN_BYTES");
}

}  // namespace roce
