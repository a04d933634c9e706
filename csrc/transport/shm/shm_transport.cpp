#include "shm_transport.hpp"

#include "../../common/error.hpp"

namespace roce::transport::shm {
namespace {

class ShmPipe : public BytePipe {
 public:
  // A ring never reports EOF: a dead peer is found by the group's lifelines
  // (csrc/liveness/lifeline.hpp), which also work across PID namespaces.
  ShmPipe(ShmRing out, ShmRing in, int peerRank, Doorbell& bell, ShmBellControl* peerBell)
      : out_(out), in_(in), peerRank_(peerRank), bell_(bell) {
    peer_.ctl = peerBell;
  }
  size_t write(const iovec* iov, int n) override {
    if (!populated_) populate();
    return out_.write(iov, n, peerRank_);
  }
  size_t read(void* dst, size_t n) override { return in_.read(dst, n, peerRank_); }
  // Data written into the peer's ring or space freed in ours: the peer may be
  // waiting for either.
  void moved() override { bell_.ring(peer_); }

 private:
  // The ring's pages are allocated by its first writer (node_shm.cpp); a
  // full /dev/shm fails this peer's requests with the cause and the fix.
  void populate() {
    if (int err = out_.allocate())
      ShmSegment::throwFull(str("the shared-memory ring to rank ", peerRank_, " (this machine)"), err,
                            "ROCE_PG_SHM_RING_BYTES");
    populated_ = true;
  }

  ShmRing out_, in_;
  int peerRank_;
  Doorbell& bell_;
  Doorbell::Peer peer_;
  bool populated_ = false;
};

std::vector<std::unique_ptr<BytePipe>> makePipes(int groupSize, NodeShm& shm,
                                                 const std::vector<int>& localRanks) {
  std::vector<std::unique_ptr<BytePipe>> pipes(groupSize);
  const int me = shm.localIndex();
  for (int i = 0; i < static_cast<int>(localRanks.size()); ++i) {
    if (i == me) continue;
    pipes[localRanks[i]] = std::make_unique<ShmPipe>(shm.ring(me, i), shm.ring(i, me), localRanks[i],
                                                     shm.doorbell(), &shm.control(i)->bell);
  }
  return pipes;
}

}  // namespace

ShmTransport::ShmTransport(int rank, int groupSize, NodeShm& shm, const std::vector<int>& localRanks,
                           Wakeup* wakeup)
    : StreamTransport(rank, makePipes(groupSize, shm, localRanks), /*copiesPayload=*/true), bell_(shm.doorbell()) {
  bell_.wakeThrough(wakeup);
}

// The doorbell (NodeShm's) may outlive the group's Wakeup.
ShmTransport::~ShmTransport() { bell_.wakeThrough(nullptr); }

bool ShmTransport::prepareWait(std::vector<pollfd>& fds, bool anySource) {
  if (!bell_.usable()) return StreamTransport::prepareWait(fds, anySource);
  (void)fds;  // a ring wakes the group's Wakeup, which the wait polls already
  bell_.announce();
  announced_ = true;
  return true;
}

void ShmTransport::afterWait() {
  if (!announced_) return;
  bell_.withdraw();
  announced_ = false;
}

}  // namespace roce::transport::shm
