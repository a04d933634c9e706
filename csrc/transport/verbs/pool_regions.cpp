#include "pool_regions.hpp"

#include <algorithm>
#include <cstdint>

#include "slot_pool.hpp"

namespace roce::transport::verbs {

PoolRegions::PoolRegions(Rails rails, size_t stride, int access, const char* what,
                         std::atomic<size_t>& processBytes, int maxRegions)
    : rails_(std::move(rails)), stride_(stride), access_(access), what_(what), processBytes_(processBytes),
      regions_(static_cast<size_t>(maxRegions)) {}

PoolRegions::~PoolRegions() {
  for (int r = 0; r < count_; ++r) processBytes_.fetch_sub(regions_[r]->registeredBytes());
}

std::unique_ptr<SlotPool> PoolRegions::make(uint32_t slots) const {
  slots = std::max<uint32_t>(2, std::min(slots, kPoolSlotMask + 1));
  return std::make_unique<SlotPool>(rails_, static_cast<size_t>(slots) * stride_, stride_, access_, what_, nullptr);
}

bool PoolRegions::add(std::unique_ptr<SlotPool> region) {
  if (full()) return false;
  processBytes_.fetch_add(region->registeredBytes());
  regions_[count_++] = std::move(region);
  return true;
}

uint32_t PoolRegions::slots() const {
  uint32_t n = 0;
  for (int r = 0; r < count_; ++r) n += regions_[r]->count();
  return n;
}

bool PoolRegions::take(uint32_t* id) {
  for (int r = 0; r < count_; ++r)
    if (regions_[r]->available() > 0) {
      *id = (static_cast<uint32_t>(r) << kPoolSlotBits) | regions_[r]->take();
      return true;
    }
  return false;
}

bool PoolRegions::give(uint32_t id) { return regions_[id >> kPoolSlotBits]->give(id & kPoolSlotMask); }

char* PoolRegions::data(uint32_t id) const { return regions_[id >> kPoolSlotBits]->slot(id & kPoolSlotMask); }

}  // namespace roce::transport::verbs
