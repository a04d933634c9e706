// Point-to-point messages between ranks on the same machine through the
// shared-memory rings of NodeShm: one copy into the ring, one copy out, no
// system call per message. Waits block on the group's Wakeup, which the
// rank's doorbell (doorbell.hpp) wakes when a peer rings it after moving a
// ring while this rank sleeps.
#pragma once
#include <memory>
#include <vector>

#include "../stream_transport.hpp"
#include "node_shm.hpp"

namespace roce::transport::shm {

class ShmTransport : public StreamTransport {
 public:
  // localRanks[i] is the group rank of local index i; groupSize sizes the peer
  // table. A ring of this rank's doorbell wakes `wakeup` (the group's), which
  // must outlive the transport.
  ShmTransport(int rank, int groupSize, NodeShm& shm, const std::vector<int>& localRanks, Wakeup* wakeup);
  ~ShmTransport() override;
  const char* name() const override { return "shm"; }
  // With a usable doorbell every ring is announced by it: the wait announces
  // itself (the Communicator's re-check follows) and blocks on the group's
  // Wakeup, which the Communicator polls already.
  // Without one, StreamTransport's: block only while no ring has pending work.
  bool prepareWait(std::vector<pollfd>& fds, bool anySource) override;
  void afterWait() override;
  bool hasSilentPeers() const override { return !announced_ && StreamTransport::hasSilentPeers(); }

 private:
  Doorbell& bell_;
  bool announced_ = false;
};

}  // namespace roce::transport::shm
