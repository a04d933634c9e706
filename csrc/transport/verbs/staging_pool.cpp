#include "staging_pool.hpp"

#include <cstdint>
#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>

#include "../../common/error.hpp"
#include "../../common/wakeup.hpp"
#include "process_pool.hpp"
#include "slot_pool.hpp"

namespace roce::transport::verbs {
namespace {
std::atomic<size_t> stagingBytes{0};  // StagingPool::processBytes
}  // namespace

std::shared_ptr<StagingPool> StagingPool::shared(const Rails& rails, size_t stride) {
  return processPool<StagingPool>(rails, stride);
}

size_t StagingPool::processBytes() { return stagingBytes.load(); }

StagingPool::StagingPool(Rails rails, size_t stride)
    : rails_(rails.size()),
      regions_(std::move(rails), stride, IBV_ACCESS_LOCAL_WRITE, "staging pool", stagingBytes, kMaxRegions) {}

void StagingPool::reserve(uint32_t slots) {
  uint32_t more = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    const uint32_t have = regions_.slots();
    if (have >= slots || regions_.full()) return;  // full: the groups share what is there
    more = slots - have;
  }
  // Registered without the lock: the other groups keep taking and giving.
  auto region = regions_.make(more);
  std::lock_guard<std::mutex> g(mu_);
  if (regions_.slots() >= slots || !regions_.add(std::move(region))) return;  // another group grew it meanwhile
  // Its slots serve the queued groups first (the other regions have none
  // free while groups queue: a slot given back goes to them).
  uint32_t id = 0;
  while (!queued_.empty() && regions_.take(&id)) release(id);
}

void StagingPool::fill(uint32_t id, Slot* slot) const {
  const SlotPool& region = regions_.region(id);
  slot->id = id;
  slot->data = regions_.data(id);
  for (size_t rail = 0; rail < rails_; ++rail) slot->lkey[rail] = region.lkey(static_cast<int>(rail));
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
  uint32_t id = 0;
  if (regions_.take(&id)) {
    fill(id, slot);
    return true;
  }
  if (pick([&](const Handed& h) { return now - h.at > std::chrono::milliseconds(1); })) return true;
  if (group && std::find(queued_.begin(), queued_.end(), group) == queued_.end()) queued_.push_back(group);
  return false;
}

void StagingPool::release(uint32_t id) {
  if (queued_.empty()) {
    regions_.give(id);
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

}  // namespace roce::transport::verbs
