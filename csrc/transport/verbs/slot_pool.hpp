// A registered region cut into fixed-size slots: one region of a process
// pool (pool_regions.hpp). Both of the verbs transport's pools are made of
// them: the landing pool, which peers write chunks into (remote write; slots
// are granted to peers, landing_pool.hpp), and the staging pool, which
// copied chunks are sent from (staging_pool.hpp). Slots serve every peer of
// every group, so registered memory per rank does not grow with the world
// size. Registered on every rail (memory_region.hpp).
#pragma once
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../common/counters.hpp"
#include "memory_region.hpp"

namespace roce::transport::verbs {

class SlotPool {
 public:
  // `counters` (may be null) tracks the registered bytes; `what` names the pool in errors.
  SlotPool(const Rails& rails, size_t bytes, size_t stride, int access, const char* what, Counters* counters);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  uint32_t count() const { return count_; }
  size_t stride() const { return stride_; }
  size_t bytes() const { return static_cast<size_t>(count_) * stride_; }
  size_t registeredBytes() const { return mrs_.bytes(); }  // pinned, page-rounded, summed over rails
  char* slot(uint32_t i) const { return base_ + static_cast<size_t>(i) * stride_; }
  uint64_t address() const { return reinterpret_cast<uint64_t>(base_); }
  uint32_t lkey(int rail) const { return mrs_.lkey(rail); }
  uint32_t rkey(int rail) const { return mrs_.rkey(rail); }

  size_t available() const { return free_.size(); }
  uint32_t take();             // requires available() > 0
  bool give(uint32_t slot);    // a slot taken before; a double give is ignored (false)

 private:
  char* base_ = nullptr;
  size_t len_ = 0;
  MemoryRegion mrs_;  // one registration per rail
  uint32_t count_ = 0;
  size_t stride_ = 0;
  std::vector<uint32_t> free_;
  std::vector<bool> inFree_;
  Counters* counters_;
};

}  // namespace roce::transport::verbs
