#include "slot_pool.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../../common/error.hpp"
#include "../../common/page_memory.hpp"
#include "verbs_device.hpp"

namespace roce::transport::verbs {

SlotPool::SlotPool(const Rails& rails, size_t bytes, size_t stride, int access, const char* what, Counters* counters)
    : stride_(stride), counters_(counters) {
  count_ = static_cast<uint32_t>(bytes / stride);
  if (count_ < 2)
    throwInvalid(str("the verbs ", what, " of ", bytes, " bytes holds fewer than two slots of ", stride,
                     " bytes: raise ROCE_PG_IB_POOL_BYTES or lower ROCE_PG_IB_SLOT_BYTES"));
  for (uint32_t s = count_; s-- > 0;) free_.push_back(s);  // before the mapping: nothing may throw after registering
  inFree_.assign(count_, true);
  const size_t len = len_ = pageRound(static_cast<size_t>(count_) * stride);
  base_ = mapPages(len);
  if (!base_) throwComm(str("out of memory allocating the ", len, "-byte verbs ", what));
  std::memset(base_, 0, len);  // touch the pages before they are pinned
  try {
    mrs_.registerOn(rails, base_, len, access, what);
  } catch (...) {
    unmapPages(base_, len);
    throw;
  }
  if (counters_) Counters::add(counters_->registeredBytes, mrs_.bytes());
}

SlotPool::~SlotPool() {
  if (counters_) counters_->registeredBytes.fetch_sub(mrs_.bytes(), std::memory_order_relaxed);
  mrs_.deregister();
  unmapPages(base_, len_);
}

uint32_t SlotPool::take() {
  const uint32_t s = free_.back();
  free_.pop_back();
  inFree_[s] = false;
  return s;
}

bool SlotPool::give(uint32_t slot) {
  if (inFree_[slot]) return false;
  inFree_[slot] = true;
  free_.push_back(slot);
  return true;
}

}  // namespace roce::transport::verbs
