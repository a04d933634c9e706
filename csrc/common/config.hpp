// Every ROCE_PG_* environment variable is read here, once per process group,
// so the README's configuration table has a single source of truth.
#pragma once
#include <cstddef>
#include <string>

namespace roce {

struct Config {
  // Route every peer, even one on the same machine, through the network transport.
  bool forceNetwork = false;             // ROCE_PG_FORCE_NETWORK=1
  // Pretend that consecutive blocks of this many global ranks are separate machines (tests).
  int simRanksPerNode = 0;               // ROCE_PG_SIM_RANKS_PER_NODE
  // Network transport between machines: "auto" or "tcp".
  std::string netTransport = "auto";     // ROCE_PG_NET_TRANSPORT
  // Interface whose IPv4 address peers use to reach this rank over TCP.
  std::string socketIfname;              // ROCE_PG_SOCKET_IFNAME
  // Pipelining granularity of the ring algorithms.
  size_t chunkBytes = 1u << 20;          // ROCE_PG_CHUNK_BYTES
  // Per-rank staging slot of the shared-memory allreduce (two of them per rank).
  size_t shmSlotBytes = 4u << 20;        // ROCE_PG_SHM_SLOT_BYTES
  // Per-direction ring between two ranks on the same machine (point-to-point).
  size_t shmRingBytes = 2u << 20;        // ROCE_PG_SHM_RING_BYTES
  // How long shutdown() lets queued work finish before failing it.
  int shutdownGraceMs = 5000;            // ROCE_PG_SHUTDOWN_GRACE_MS

  static Config fromEnv();
  std::string describe() const;
};

}  // namespace roce
