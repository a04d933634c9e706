// The shared memory of one process group on one machine. Every local rank owns
// one segment holding
//   * its barrier counter and the descriptor of the shared-memory collective
//     it is running (algorithms/shm_call.hpp),
//   * its doorbell's announce flag, its process's doorbell address and its key (doorbell.hpp),
//   * one inbound ring per local peer (point-to-point messages to this rank),
//   * two staging slots for the shared-memory collectives (double-buffered).
// Every local rank maps every other rank's segment, so a rank reads its peers'
// slots directly and writes straight into the rings of its peers.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../../common/futex.hpp"
#include "doorbell.hpp"
#include "shm_ring.hpp"
#include "shm_segment.hpp"

namespace roce {
class Bootstrap;
}
namespace roce::transport::shm {


struct alignas(64) ShmRankControl {
  std::atomic<uint64_t> arrived;  // barrier generation this rank has reached
  char pad0[64 - sizeof(std::atomic<uint64_t>)];
  // What the rank's current shared-memory collective is, checked by all ranks
  // before reducing so that mismatched calls fail everywhere instead of
  // corrupting memory or hanging. One per slot parity, like the slots: after
  // a one-barrier call's only barrier a fast peer may already announce its
  // next call, which must not overwrite what a slow rank is about to check.
  std::atomic<uint64_t> opCount[2];
  std::atomic<uint32_t> opKind[2];
  char pad1[64 - 2 * sizeof(std::atomic<uint64_t>) - 2 * sizeof(std::atomic<uint32_t>)];
  // Peers waiting for this rank to arrive sleep here (futex, across
  // processes); the rank wakes them right after it bumps `arrived`.
  ShmWakeup arrivals;
  // Peers that moved a ring this rank waits on ring here if it sleeps.
  ShmBellControl bell;
  // The collective tag of the rank's latest collective that exchanges
  // messages (gather, scatter, all_to_all, algorithms forced onto
  // point-to-point), shifted left by one; with bit 0 set, the tag the
  // shared-memory barrier it runs looks for (the next one, not taken): a
  // rank waiting in that barrier for a peer that runs a message collective
  // under that tag fails the group instead of waiting for the timeout
  // (shm_barrier.cpp).
  alignas(64) std::atomic<uint64_t> collectiveTag{0};
};

class NodeShm {
 public:
  // Collective over the local ranks (`localRanks` are group ranks in order,
  // `me` is this rank's index among them). Blocks until all peers mapped.
  NodeShm(Bootstrap& bs, const std::vector<int>& localRanks, int me, size_t ringBytes,
          size_t slotBytes, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout);

  int localSize() const { return static_cast<int>(segs_.size()); }
  int localIndex() const { return me_; }
  // Ring carrying bytes from local rank `from` to local rank `to` (lives in `to`'s segment).
  ShmRing ring(int from, int to);
  char* slot(int local, int buffer) const;
  // Allocates this rank's two slots up to `bytes` (a high-water mark: once
  // per group in practice) before a collective writes that much into one;
  // throws, naming the fix, when /dev/shm is full. Peers read only what the
  // owner wrote, so only the owner allocates.
  void prepareOwnSlots(size_t bytes);
  size_t slotBytes() const { return slotBytes_; }
  ShmRankControl* control(int local) const;
  Doorbell& doorbell() { return *bell_; }

 private:
  // Publishes nothing: maps the peers' published segments, keeps `mine`, and
  // unlinks its name once every local rank mapped everything.
  void mapPeers(Bootstrap& bs, const std::vector<int>& localRanks, ShmSegment mine,
                std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout);
  size_t ringOffset(int from) const;
  size_t slotOffset(int buffer) const;

  int me_;
  size_t ringBytes_, slotBytes_, ringsBytes_, bytes_;
  size_t slotsReady_ = 0;  // bytes of each own slot allocated (called by the group's one operation thread)
  std::vector<ShmSegment> segs_;
  std::unique_ptr<Doorbell> bell_;  // its address and key are in this rank's control page
};

}  // namespace roce::transport::shm
