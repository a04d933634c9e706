#include "landing_pool.hpp"

#include <cstdint>
#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "../../common/error.hpp"
#include "../../common/wakeup.hpp"
#include "process_pool.hpp"
#include "slot_pool.hpp"

namespace roce::transport::verbs {
namespace {
std::atomic<size_t> landingBytes{0};  // LandingPool::processBytes
}  // namespace

std::shared_ptr<LandingPool> LandingPool::shared(const Rails& rails, size_t stride) {
  return processPool<LandingPool>(rails, stride);
}

size_t LandingPool::processBytes() { return landingBytes.load(); }

LandingPool::LandingPool(Rails rails, size_t stride)
    : rails_(rails.size()),
      regions_(std::move(rails), stride, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "landing pool",
               landingBytes, kMaxRegions) {}

uint32_t LandingPool::total() const { return regions_.slots() - lost_; }

void LandingPool::wakeWaiting() {
  publish();  // before the wake-ups: a woken group reads the snapshots
  wakeupsNow_.fetch_add(1, std::memory_order_release);
  for (Wakeup* w : waiting_) w->wake();  // under the lock: forget() cannot race with it
  waiting_.clear();
}

void LandingPool::publish() {
  openMaxNow_.store(openMax_, std::memory_order_release);
  openFreeNow_.store(openFreeLocked(), std::memory_order_release);
}

void LandingPool::join(Share& share, uint32_t reserved, uint32_t open) {
  // Joins one at a time: two groups' first connections at once would
  // otherwise both register the pool.
  std::lock_guard<std::mutex> growing(growMu_);
  for (;;) {
    uint32_t more = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      const uint32_t want = reservedSum_ + reserved + std::max(openMax_, open);
      const uint32_t have = total();
      if (have >= want) {
        // Backed: the free slots cover every unused reservation and the
        // open share (openHeld_ <= openMax_ <= have - reservedSum_).
        reservedSum_ += reserved;
        reservedUnused_ += reserved;
        const bool wider = open > openMax_;
        openMax_ = std::max(openMax_, open);
        share = Share{reserved, 0, true};
        if (wider) wakeWaiting();  // the open share has room again
        else publish();
        return;
      }
      if (regions_.full())
        throwInvalid(str("the verbs landing pool of this process has grown ", kMaxRegions,
                         " times (one region per group of a new shape): destroy process groups that are no longer used"));
      more = want - have;
    }
    // Registered without the lock: the other groups keep granting meanwhile.
    auto region = regions_.make(more);
    const uint32_t added = region->count();
    std::lock_guard<std::mutex> g(mu_);
    if (!regions_.add(std::move(region))) continue;  // full: reported above on the next round
    free_ += added;
    publish();  // then look again: another group may have joined meanwhile
  }
}

void LandingPool::leave(Share& share) {
  if (!share.joined) return;
  std::lock_guard<std::mutex> g(mu_);
  // The caller gave its slots back; one it still held (no caller leaves one)
  // could never be given after this, so it stops counting as the pool's.
  lost_ += share.held;
  reservedSum_ -= share.reserved;
  reservedUnused_ -= share.reserved - share.held;
  share = Share{};
  wakeWaiting();  // the open share may have room again
}

uint32_t LandingPool::openFreeLocked() const {
  // Free slots beyond the unused reservations, and within the open share.
  const uint32_t beyond = free_ > reservedUnused_ ? free_ - reservedUnused_ : 0;
  return std::min(beyond, openMax_ > openHeld_ ? openMax_ - openHeld_ : 0);
}

uint32_t LandingPool::takeAny() {
  uint32_t id = 0;
  if (!regions_.take(&id))
    throwInvalid("the verbs landing pool has no free slot although its accounting says so (a bug)");
  --free_;
  return id;
}

LandingPool::Slot LandingPool::slot(uint32_t id) const {
  Slot s;
  s.id = id;
  s.addr = reinterpret_cast<uint64_t>(regions_.data(id));
  const SlotPool& region = regions_.region(id);
  for (size_t rail = 0; rail < rails_; ++rail) s.rkey[rail] = region.rkey(static_cast<int>(rail));
  return s;
}

bool LandingPool::takeOpen(Slot* slot, uint32_t keep, Wakeup* waiter) {
  std::lock_guard<std::mutex> g(mu_);
  if (openFreeLocked() <= keep) {
    if (waiter && std::find(waiting_.begin(), waiting_.end(), waiter) == waiting_.end()) waiting_.push_back(waiter);
    return false;
  }
  ++openHeld_;
  *slot = this->slot(takeAny());
  publish();
  return true;
}

bool LandingPool::takeReserved(Share& share, Slot* slot) {
  std::lock_guard<std::mutex> g(mu_);
  if (share.held >= share.reserved) return false;
  ++share.held;
  --reservedUnused_;
  *slot = this->slot(takeAny());
  publish();
  return true;
}

void LandingPool::give(Share* share, uint32_t id) {
  std::lock_guard<std::mutex> g(mu_);
  if (!regions_.give(id)) return;  // given already
  ++free_;
  if (share) {
    --share->held;
    ++reservedUnused_;
    publish();
  } else {
    --openHeld_;
    wakeWaiting();  // publishes first
  }
}

void LandingPool::forget(Wakeup* waiter) {
  std::lock_guard<std::mutex> g(mu_);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), waiter), waiting_.end());
}

char* LandingPool::data(uint32_t id) const { return regions_.data(id); }

}  // namespace roce::transport::verbs
