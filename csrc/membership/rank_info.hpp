// What each rank publishes about itself when a group forms (see roster.hpp):
// where it runs, how to reach it, and the settings every rank must share.
#pragma once
#include <cstdint>
#include <string>

namespace roce::membership {

struct RankInfo {
  std::string nodeId;   // machine identity used for placement (may be simulated)
  std::string hostId;   // real machine identity: same hostId => loopback works
  int pid = 0;
  std::string tcpHost;
  int tcpPort = 0;
  // RDMA ports it drives, 0: none usable (every rank sets up as many queue
  // pairs per connection as the rank with the most).
  int verbsRails = 0;
  bool verbs() const { return verbsRails > 0; }
  std::string noVerbsWhy; // otherwise, what was looked for (one line)
  uint64_t nonce = 0;     // random per rank and group incarnation: TCP hellos must carry it
  // Shared-memory layout this rank would use: every rank of a machine must agree.
  uint64_t shmRingBytes = 0, shmSlotBytes = 0;
  // Algorithm choice and message chunking (Config::algorithmSettings()): every
  // rank must agree, or the ranks would run different message patterns.
  std::string algorithms;
  // Config::usableCpus(): with ROCE_PG_NCHANNELS unset every rank derives the
  // group's channel count from all ranks' CPUs, so all agree (see Communicator).
  int cpus = 1;

  // The hostname part of hostId, for messages.
  std::string hostName() const;

  std::string encode() const;
  // Throws (naming `rank`) on anything malformed: values from the store are not trusted.
  static RankInfo decode(const std::string& s, int rank);
};

// Real machine identity of this process: hostname plus kernel boot id (hostnames
// repeat across containers and VMs; boot ids do not).
std::string localHostId();

}  // namespace roce::membership
