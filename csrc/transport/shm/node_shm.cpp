#include "node_shm.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "../../common/bootstrap.hpp"
#include "../../common/config.hpp"
#include "../../common/error.hpp"

namespace roce::transport::shm {
namespace {
constexpr size_t kPage = 4096;
size_t roundUp(size_t x) { return (x + kPage - 1) & ~(kPage - 1); }
const char* const kNamePrefix = "roce_pg";
static_assert(sizeof(ShmRankControl) <= kPage, "the control block must fit its page");
}  // namespace

NodeShm::NodeShm(Bootstrap& bs, const std::vector<int>& localRanks, int me, size_t ringBytes,
                 size_t slotBytes, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout)
    : me_(me), ringBytes_(ringBytes), slotBytes_(slotBytes) {
  const int n = static_cast<int>(localRanks.size());
  // Layout: [control page][one ring per local rank, own index unused][slot 0][slot 1]
  ringsBytes_ = static_cast<size_t>(n) * roundUp(sizeof(ShmRingControl) + ringBytes);
  bytes_ = kPage + ringsBytes_ + 2 * roundUp(slotBytes);
  // A ring's pages beyond its first are allocated by the peer that first
  // writes into it (ShmRing::allocate), a slot's by its owner up to what its
  // collectives have written (prepareOwnSlots), so a group's /dev/shm
  // follows the peers it exchanges messages with and the sizes it reduces.
  // Its control page, the rings' first pages (the reader polls the indices
  // there) and the slots' first pages (a collective of up to 4 KiB per rank
  // allocates nothing) are reserved now.
  ShmSegment::Ranges reserve;
  if (ShmSegment::canPopulate()) {
    reserve.emplace_back(0, kPage);
    for (int from = 0; from < n; ++from)
      if (from != me) reserve.emplace_back(ringOffset(from), kPage);
    for (int buffer = 0; buffer < 2; ++buffer) reserve.emplace_back(slotOffset(buffer), kPage);
  }
  // Also where everything is reserved (then ShmSegment::allocate does
  // nothing), so that the shm_full test fault fails the slots everywhere.
  slotsReady_ = std::min(kPage, slotBytes_);
  ShmSegment mine = ShmSegment::create(bytes_, kNamePrefix, reserve);
  auto* ctl = new (mine.data()) ShmRankControl{};
  bell_ = std::make_unique<Doorbell>(&ctl->bell);  // address and key before the segment is published
  for (int from = 0; from < n; ++from)
    if (from != me) new (mine.data() + ringOffset(from)) ShmRingControl{};  // own index: never used nor reserved

  const int myRank = localRanks[me];
  bs.set(str("shm/", myRank), mine.name());
  if (testFault() == "die_forming_shm") raise(SIGKILL);
  try {
    mapPeers(bs, localRanks, std::move(mine), deadline, timeout);
  } catch (...) {
    // A peer killed before everyone mapped its segment left its name behind;
    // its lock is free now (a peer that failed otherwise unlinks its own).
    ShmSegment::sweepLeftovers(kNamePrefix);
    throw;
  }
}

void NodeShm::mapPeers(Bootstrap& bs, const std::vector<int>& localRanks, ShmSegment mine,
                       std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout) {
  const int n = static_cast<int>(localRanks.size());
  std::vector<std::string> keys;
  for (int r : localRanks) keys.push_back(str("shm/", r));
  auto values = waitForKeys(bs, keys, deadline, timeout, "shared-memory setup",
                            [&](size_t i) { return str("rank ", localRanks[i]); });
  segs_.resize(n);
  for (int i = 0; i < n; ++i) {
    if (i == me_) continue;
    // Segment names come from the store: only names of the form we create are
    // opened (no path tricks), and open() checks owner and size before mapping.
    if (values[i].rfind(str("/", kNamePrefix, "."), 0) != 0 || values[i].find('/', 1) != std::string::npos ||
        values[i].size() > 200)
      throwComm(str("rank ", localRanks[i], " published an invalid shared-memory segment name '", values[i],
                    "' (mixed roce_pg versions across ranks?)"));
    segs_[i] = ShmSegment::open(values[i], bytes_, localRanks[i]);
  }
  segs_[me_] = std::move(mine);
  // Once everyone has mapped every segment the names are no longer needed.
  storeBarrier(bs, str("shm/mapped/", localRanks[0]), n, deadline, timeout,
               "shared-memory setup (mapping peers' segments)");
  segs_[me_].unlink();
}

size_t NodeShm::ringOffset(int from) const {
  return kPage + static_cast<size_t>(from) * roundUp(sizeof(ShmRingControl) + ringBytes_);
}

ShmRing NodeShm::ring(int from, int to) {
  char* base = segs_[to].data() + ringOffset(from);
  return ShmRing(reinterpret_cast<ShmRingControl*>(base), base + sizeof(ShmRingControl), ringBytes_);
}

size_t NodeShm::slotOffset(int buffer) const {
  return kPage + ringsBytes_ + static_cast<size_t>(buffer) * roundUp(slotBytes_);
}

char* NodeShm::slot(int local, int buffer) const { return segs_[local].data() + slotOffset(buffer); }

void NodeShm::prepareOwnSlots(size_t bytes) {
  bytes = std::min(bytes, slotBytes_);
  if (bytes <= slotsReady_) return;
  for (int buffer = 0; buffer < 2; ++buffer)
    if (int err = ShmSegment::allocate(slot(me_, buffer), bytes))
      ShmSegment::throwFull(str("this rank's shared-memory slots (", (bytes + 1023) >> 10, " KiB each)"), err,
                            "ROCE_PG_SHM_SLOT_BYTES (or ROCE_PG_SHM_CHUNK_BYTES and ROCE_PG_SHM_ONESHOT_MAX_BYTES)");
  slotsReady_ = bytes;
}

ShmRankControl* NodeShm::control(int local) const {
  return reinterpret_cast<ShmRankControl*>(segs_[local].data());
}

}  // namespace roce::transport::shm
