#include "shm_transport.hpp"

#include "../../common/error.hpp"

namespace roce {
namespace {

class ShmPipe : public BytePipe {
 public:
  // A ring never reports EOF: a dead peer is found by the group's lifelines
  // (csrc/comm/lifeline.hpp), which also work across PID namespaces.
  ShmPipe(ShmRing out, ShmRing in, int peerRank) : out_(out), in_(in), peerRank_(peerRank) {}
  size_t write(const iovec* iov, int n) override { return out_.write(iov, n, peerRank_); }
  size_t read(void* dst, size_t n) override { return in_.read(dst, n, peerRank_); }

 private:
  ShmRing out_, in_;
  int peerRank_;
};

std::vector<std::unique_ptr<BytePipe>> makePipes(int groupSize, NodeShm& shm,
                                                 const std::vector<int>& localRanks) {
  std::vector<std::unique_ptr<BytePipe>> pipes(groupSize);
  const int me = shm.localIndex();
  for (int i = 0; i < static_cast<int>(localRanks.size()); ++i) {
    if (i == me) continue;
    pipes[localRanks[i]] = std::make_unique<ShmPipe>(shm.ring(me, i), shm.ring(i, me), localRanks[i]);
  }
  return pipes;
}

}  // namespace

ShmTransport::ShmTransport(int rank, int groupSize, NodeShm& shm, const std::vector<int>& localRanks)
    : StreamTransport(rank, makePipes(groupSize, shm, localRanks), /*copiesPayload=*/true) {}

}  // namespace roce
