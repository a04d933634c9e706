// The staging slots that copied chunks go out from: one pool per process for
// each set of rails and slot size, which every group of the process shares
// (issue 27: an extra group registers no staging bytes of its own).
//
// Why no group needs a guaranteed share (the landing pool would, so it stays
// per group): a group takes a staging slot only to post a chunk the receiver
// already granted a landing slot for, and the slot comes back at the write's
// local completion, which the remote NIC's acknowledgement brings - no
// software on either side has to act first (the receiver's queue pair has a
// receive posted for every credit it granted). So a group that finds none
// free waits a few microseconds for another group's chunk, never for
// another group's progress; give() wakes the groups that found none.
//
// Size: the most any of its groups asked for (verbsPoolSizes: a quarter of
// ROCE_PG_IB_POOL_BYTES at most), not their sum. A group asking more than
// the pool holds adds a region of the difference (up to kMaxRegions); the
// regions stay until the last group using the pool goes, so creating and
// destroying groups of one shape registers nothing new.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "memory_region.hpp"
#include "port_choice.hpp"

namespace roce {

class SlotPool;
class Wakeup;

class StagingPool {
 public:
  // The process's pool for `rails` (in this order: a slot's lkey is asked by
  // rail index) and slots of `stride` bytes; created on first use.
  static std::shared_ptr<StagingPool> shared(const Rails& rails, size_t stride);
  // Registered bytes of every staging pool of the process (runtime stats).
  static size_t processBytes();

  StagingPool(Rails rails, size_t stride);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Makes the pool hold at least `slots` slots; throws (memlock) without
  // changing it if the registration fails.
  void reserve(uint32_t slots);
  struct Slot {
    uint32_t id = 0;  // what give() takes back (fits a work request id's 24 bits)
    char* data = nullptr;
    uint32_t lkey[kMaxRails] = {};  // per rail
  };
  // A free slot, or false: then `hungry` (may be null) is woken by the next
  // give().
  bool tryTake(Slot* slot, Wakeup* hungry);
  void give(uint32_t id);
  // A group going: its wake-up must not be called any more.
  void forget(Wakeup* hungry);

  uint32_t slots() const;

  static constexpr int kMaxRegions = 16;  // ids: region in bits 20-23, slot in 0-19 (wr_id has 24)

 private:
  const Rails rails_;
  const size_t stride_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<SlotPool>> regions_;  // never shrinks while the pool lives
  std::vector<Wakeup*> hungry_;
};

}  // namespace roce
