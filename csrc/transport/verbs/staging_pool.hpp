// The staging slots that copied chunks go out from: one pool per process for
// each set of rails and slot size, which every group of the process shares,
// so an extra group registers no staging bytes of its own.
//
// Why no group needs a guaranteed share (the landing pool would, so it stays
// per group): a group takes a staging slot only to post a chunk the receiver
// already granted a landing slot for, and the write completes when the
// remote NIC acknowledges it - no software on either side has to act first
// (the receiver's queue pair has a receive posted for every credit it
// granted). The owning group then gives the slot back when it polls that
// completion, which its progress thread does promptly while it has chunks
// in flight (a blocked wait is woken by the completion). So a group that
// finds none free waits for other groups' chunks, not for their next
// operation: no cycle between groups can form. The wait is longer when a
// chunk's peer died (the queue pair's retries, ROCE_PG_IB_TIMEOUT /
// ROCE_PG_IB_RETRY_CNT, until the flush) - the same wait that group's own
// other chunks see.
//
// Fairness: a group that found none free queues (FIFO); a slot given back
// while groups queue is handed to the first of them and wakes it, so a
// group streaming copied chunks cannot take every slot back as it frees
// them. A handed slot its group has not claimed within a millisecond
// (it did not need one after all) may be taken by any group.
//
// Size: the most any of its groups asked for (verbsPoolSizes: a quarter of
// ROCE_PG_IB_POOL_BYTES at most), not their sum. A group asking more than
// the pool holds adds a region of the difference (up to kMaxRegions); the
// regions stay until the last group using the pool goes, so creating and
// destroying groups of one shape registers nothing new.
#pragma once
#include <chrono>
#include <cstddef>
#include <deque>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "memory_region.hpp"
#include "pool_regions.hpp"
#include "port_choice.hpp"

namespace roce {
class Wakeup;
}
namespace roce::transport::verbs {


class StagingPool {
 public:
  // The process's pool for `rails` (in this order: a slot's lkey is asked by
  // rail index) and slots of `stride` bytes; created on first use.
  static std::shared_ptr<StagingPool> shared(const Rails& rails, size_t stride);
  // Registered bytes of every staging pool of the process (runtime stats).
  static size_t processBytes();

  StagingPool(Rails rails, size_t stride);
  ~StagingPool() = default;
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
  // A free slot (or one handed to `group`), or false: then `group` queues
  // and is woken when a slot is handed to it. `group` identifies the group
  // (its wake-up); null: no queueing.
  bool tryTake(Slot* slot, Wakeup* group);
  void give(uint32_t id);
  // A group going: it leaves the queue, slots handed to it go to the next,
  // and its wake-up is not called any more.
  void forget(Wakeup* group);

  static constexpr int kMaxRegions = 16;  // ids: region in bits 20-23, slot in 0-19 (wr_id has 24)

 private:
  const size_t rails_;  // how many rails a slot has an lkey on
  struct Handed {
    uint32_t id;
    Wakeup* to;
    std::chrono::steady_clock::time_point at;
  };
  void fill(uint32_t id, Slot* slot) const;  // under mu_
  void release(uint32_t id);                  // under mu_: to the first queued group, or free

  mutable std::mutex mu_;
  PoolRegions regions_;          // never shrinks while the pool lives
  std::deque<Wakeup*> queued_;   // groups that found none free, first come first served
  std::vector<Handed> handed_;   // slots given back to a queued group, not claimed yet
};

}  // namespace roce::transport::verbs
