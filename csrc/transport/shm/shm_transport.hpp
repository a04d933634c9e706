// Point-to-point messages between ranks on the same machine through the
// shared-memory rings of NodeShm: one copy into the ring, one copy out, no
// system call per message.
#pragma once
#include <memory>
#include <vector>

#include "../stream_transport.hpp"
#include "node_shm.hpp"

namespace roce {

class ShmTransport : public StreamTransport {
 public:
  // localRanks[i] is the group rank of local index i; groupSize sizes the peer table.
  ShmTransport(int rank, int groupSize, NodeShm& shm, const std::vector<int>& localRanks);
  const char* name() const override { return "shm"; }
};

}  // namespace roce
