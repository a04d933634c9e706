#include "shm_transport.hpp"

#include <signal.h>

#include <cerrno>

#include "../../common/error.hpp"

namespace roce {
namespace {

class ShmPipe : public BytePipe {
 public:
  ShmPipe(ShmRing out, ShmRing in, int peerRank, int peerPid)
      : out_(out), in_(in), peerRank_(peerRank), peerPid_(peerPid) {}
  size_t write(const iovec* iov, int n) override { return out_.write(iov, n); }
  size_t read(void* dst, size_t n) override { return in_.read(dst, n); }
  void checkAlive() override {
    // A ring never reports EOF, so ask the kernel whether the peer still exists.
    if (kill(peerPid_, 0) != 0 && errno == ESRCH)
      throwComm(str("rank ", peerRank_, " (pid ", peerPid_, " on this machine) exited while "
                    "this rank was waiting for it; see that rank's output for the cause"));
  }

 private:
  ShmRing out_, in_;
  int peerRank_, peerPid_;
};

std::vector<std::unique_ptr<BytePipe>> makePipes(int groupSize, NodeShm& shm,
                                                 const std::vector<int>& localRanks) {
  std::vector<std::unique_ptr<BytePipe>> pipes(groupSize);
  const int me = shm.localIndex();
  for (int i = 0; i < static_cast<int>(localRanks.size()); ++i) {
    if (i == me) continue;
    pipes[localRanks[i]] = std::make_unique<ShmPipe>(shm.ring(me, i), shm.ring(i, me), localRanks[i], shm.pid(i));
  }
  return pipes;
}

}  // namespace

ShmTransport::ShmTransport(int rank, int groupSize, NodeShm& shm, const std::vector<int>& localRanks)
    : StreamTransport(rank, makePipes(groupSize, shm, localRanks)) {}

}  // namespace roce
