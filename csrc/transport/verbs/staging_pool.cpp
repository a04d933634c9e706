#include "staging_pool.hpp"

#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>

#include "../../common/error.hpp"
#include "../../common/wakeup.hpp"
#include "slot_pool.hpp"

namespace roce {
namespace {
constexpr uint32_t kSlotBits = 20;
constexpr uint32_t kSlotMask = (1u << kSlotBits) - 1;
std::atomic<size_t> stagingBytes{0};  // StagingPool::processBytes
}  // namespace

std::shared_ptr<StagingPool> StagingPool::shared(const Rails& rails, size_t stride) {
  static std::mutex mu;
  static std::map<std::vector<const void*>, std::weak_ptr<StagingPool>> open;
  // The devices are per process (VerbsDevice::shared keys by pid): a forked
  // child never finds its parent's pool here.
  std::vector<const void*> key;
  for (const auto& dev : rails) key.push_back(dev.get());
  key.push_back(reinterpret_cast<const void*>(stride));
  key.push_back(reinterpret_cast<const void*>(static_cast<uintptr_t>(getpid())));
  std::lock_guard<std::mutex> g(mu);
  if (auto pool = open[key].lock()) return pool;
  auto pool = std::make_shared<StagingPool>(rails, stride);
  open[key] = pool;
  return pool;
}

size_t StagingPool::processBytes() { return stagingBytes.load(); }

StagingPool::StagingPool(Rails rails, size_t stride) : rails_(std::move(rails)), stride_(stride) {}

StagingPool::~StagingPool() {
  for (const auto& r : regions_) stagingBytes.fetch_sub(r->registeredBytes());
}

void StagingPool::reserve(uint32_t slots) {
  std::lock_guard<std::mutex> g(mu_);
  uint32_t have = 0;
  for (const auto& r : regions_) have += r->count();
  if (have >= slots || regions_.size() >= static_cast<size_t>(kMaxRegions)) return;  // full: the groups share what is there
  const uint32_t more = std::max<uint32_t>(2, std::min(slots - have, kSlotMask + 1));
  regions_.push_back(std::make_unique<SlotPool>(rails_, static_cast<size_t>(more) * stride_, stride_,
                                                IBV_ACCESS_LOCAL_WRITE, "staging pool", nullptr));
  stagingBytes.fetch_add(regions_.back()->registeredBytes());
}

bool StagingPool::tryTake(Slot* slot, Wakeup* hungry) {
  std::lock_guard<std::mutex> g(mu_);
  for (uint32_t r = 0; r < regions_.size(); ++r)
    if (SlotPool& region = *regions_[r]; region.available() > 0) {
      const uint32_t s = region.take();
      slot->id = (r << kSlotBits) | s;
      slot->data = region.slot(s);
      for (size_t rail = 0; rail < rails_.size(); ++rail) slot->lkey[rail] = region.lkey(static_cast<int>(rail));
      return true;
    }
  if (hungry && std::find(hungry_.begin(), hungry_.end(), hungry) == hungry_.end()) hungry_.push_back(hungry);
  return false;
}

void StagingPool::give(uint32_t id) {
  std::lock_guard<std::mutex> g(mu_);
  regions_.at(id >> kSlotBits)->give(id & kSlotMask);
  // Under the lock: forget() (a group going) cannot race with the call.
  for (Wakeup* w : hungry_) w->wake();
  hungry_.clear();
}

void StagingPool::forget(Wakeup* hungry) {
  std::lock_guard<std::mutex> g(mu_);
  hungry_.erase(std::remove(hungry_.begin(), hungry_.end(), hungry), hungry_.end());
}

uint32_t StagingPool::slots() const {
  std::lock_guard<std::mutex> g(mu_);
  uint32_t n = 0;
  for (const auto& r : regions_) n += r->count();
  return n;
}

}  // namespace roce
