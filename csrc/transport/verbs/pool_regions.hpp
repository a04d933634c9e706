// The registered memory of a process pool (LandingPool, StagingPool): slots
// of one stride in separately registered regions (SlotPool), so that a pool
// can grow while groups use it. A slot is named by an id, its region in the
// bits from kPoolSlotBits up and its index below (process_pool.hpp).
//
// Regions are added and never removed or moved while the set lives, so the
// address and keys of a slot whose id was handed out can be read without the
// owning pool's lock (the region was published under that lock before the
// id existed). Everything else - add, take, give, slots - runs under the
// owning pool's lock; registering a new region (make) needs none, so the
// other groups keep taking and giving meanwhile.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "memory_region.hpp"
#include "process_pool.hpp"

namespace roce::transport::verbs {

class SlotPool;

class PoolRegions {
 public:
  // `what` names the pool in errors; `processBytes` sums the registered bytes
  // of every pool of its kind in the process (runtime stats).
  PoolRegions(Rails rails, size_t stride, int access, const char* what, std::atomic<size_t>& processBytes,
              int maxRegions);
  ~PoolRegions();
  PoolRegions(const PoolRegions&) = delete;
  PoolRegions& operator=(const PoolRegions&) = delete;

  // A region of `slots` slots (at least 2, at most one id space), registered
  // on every rail now; throws (memlock) if it cannot be.
  std::unique_ptr<SlotPool> make(uint32_t slots) const;
  // Adds a region made before; false (dropping it) when maxRegions are there.
  bool add(std::unique_ptr<SlotPool> region);
  bool full() const { return count_ == static_cast<int>(regions_.size()); }

  uint32_t slots() const;  // in all regions
  // A free slot's id (the first region with one), or false.
  bool take(uint32_t* id);
  // Gives back a taken slot; false if it was free already (a double give).
  bool give(uint32_t id);

  // Lock-free, for ids handed out (see above).
  char* data(uint32_t id) const;
  const SlotPool& region(uint32_t id) const { return *regions_[id >> kPoolSlotBits]; }

 private:
  const Rails rails_;
  const size_t stride_;
  const int access_;
  const char* what_;
  std::atomic<size_t>& processBytes_;
  std::vector<std::unique_ptr<SlotPool>> regions_;  // sized maxRegions at construction: never reallocated
  int count_ = 0;
};

}  // namespace roce::transport::verbs
