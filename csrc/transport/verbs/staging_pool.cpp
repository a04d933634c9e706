#include "staging_pool.hpp"

#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>

#include "../../common/error.hpp"
#include "../../common/wakeup.hpp"
#include "process_pool.hpp"
#include "slot_pool.hpp"

namespace roce {
namespace {
std::atomic<size_t> stagingBytes{0};  // StagingPool::processBytes
}  // namespace

std::shared_ptr<StagingPool> StagingPool::shared(const Rails& rails, size_t stride) {
  return processPool<StagingPool>(rails, stride);
}

size_t StagingPool::processBytes() { return stagingBytes.load(); }

StagingPool::StagingPool(Rails rails, size_t stride) : rails_(std::move(rails)), stride_(stride) {}

StagingPool::~StagingPool() {
  for (const auto& r : regions_) stagingBytes.fetch_sub(r->registeredBytes());
}

void StagingPool::reserve(uint32_t slots) {
  uint32_t more = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    uint32_t have = 0;
    for (const auto& r : regions_) have += r->count();
    if (have >= slots || regions_.size() >= static_cast<size_t>(kMaxRegions)) return;  // full: the groups share what is there
    more = std::max<uint32_t>(2, std::min(slots - have, kPoolSlotMask + 1));
  }
  // Registered without the lock: the other groups keep taking and giving.
  auto region = std::make_unique<SlotPool>(rails_, static_cast<size_t>(more) * stride_, stride_,
                                           IBV_ACCESS_LOCAL_WRITE, "staging pool", nullptr);
  std::lock_guard<std::mutex> g(mu_);
  uint32_t have = 0;
  for (const auto& r : regions_) have += r->count();
  if (have >= slots || regions_.size() >= static_cast<size_t>(kMaxRegions)) return;  // another group grew it meanwhile
  regions_.push_back(std::move(region));
  stagingBytes.fetch_add(regions_.back()->registeredBytes());
  // Its slots serve the queued groups first.
  const uint32_t r = static_cast<uint32_t>(regions_.size() - 1);
  for (uint32_t s = 0; s < regions_[r]->count() && !queued_.empty(); ++s) release((r << kPoolSlotBits) | regions_[r]->take());
}

void StagingPool::fill(uint32_t id, Slot* slot) const {
  const SlotPool& region = *regions_.at(id >> kPoolSlotBits);
  slot->id = id;
  slot->data = region.slot(id & kPoolSlotMask);
  for (size_t rail = 0; rail < rails_.size(); ++rail) slot->lkey[rail] = region.lkey(static_cast<int>(rail));
}

bool StagingPool::tryTake(Slot* slot, Wakeup* group) {
  std::lock_guard<std::mutex> g(mu_);
  const auto now = std::chrono::steady_clock::now();
  // First a slot handed to this group, then a free one, then one handed to
  // a group that has not claimed it for a millisecond.
  auto pick = [&](auto pred) {
    for (size_t i = 0; i < handed_.size(); ++i)
      if (pred(handed_[i])) {
        fill(handed_[i].id, slot);
        handed_.erase(handed_.begin() + static_cast<long>(i));
        return true;
      }
    return false;
  };
  if (group && pick([&](const Handed& h) { return h.to == group; })) return true;
  for (uint32_t r = 0; r < regions_.size(); ++r)
    if (regions_[r]->available() > 0) {
      fill((r << kPoolSlotBits) | regions_[r]->take(), slot);
      return true;
    }
  if (pick([&](const Handed& h) { return now - h.at > std::chrono::milliseconds(1); })) return true;
  if (group && std::find(queued_.begin(), queued_.end(), group) == queued_.end()) queued_.push_back(group);
  return false;
}

void StagingPool::release(uint32_t id) {
  if (queued_.empty()) {
    regions_.at(id >> kPoolSlotBits)->give(id & kPoolSlotMask);
    return;
  }
  Wakeup* to = queued_.front();
  queued_.pop_front();
  handed_.push_back({id, to, std::chrono::steady_clock::now()});
  to->wake();  // under the lock: forget() (a group going) cannot race with it
}

void StagingPool::give(uint32_t id) {
  std::lock_guard<std::mutex> g(mu_);
  release(id);
}

void StagingPool::forget(Wakeup* group) {
  std::lock_guard<std::mutex> g(mu_);
  queued_.erase(std::remove(queued_.begin(), queued_.end(), group), queued_.end());
  std::vector<uint32_t> mine;
  for (auto it = handed_.begin(); it != handed_.end();) {
    if (it->to == group) {
      mine.push_back(it->id);
      it = handed_.erase(it);
    } else {
      ++it;
    }
  }
  for (uint32_t id : mine) release(id);
}

}  // namespace roce
