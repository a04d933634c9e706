// The one pool of a kind (LandingPool, StagingPool) per process for a set of
// rails and a slot stride: created by the first group that asks, shared by
// every later one while any of them holds it.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "memory_region.hpp"

namespace roce::transport::verbs {

// A process pool's slot id: the region in the bits from kPoolSlotBits up,
// the slot within it below.
constexpr uint32_t kPoolSlotBits = 20;
constexpr uint32_t kPoolSlotMask = (1u << kPoolSlotBits) - 1;

template <class Pool>
std::shared_ptr<Pool> processPool(const Rails& rails, size_t stride) {
  static std::mutex mu;
  static std::map<std::vector<const void*>, std::weak_ptr<Pool>> open;
  // Keyed by the devices (per process: VerbsDevice::shared keys by pid), the
  // stride and the pid, so a forked child never finds its parent's pool.
  std::vector<const void*> key;
  for (const auto& dev : rails) key.push_back(dev.get());
  key.push_back(reinterpret_cast<const void*>(stride));
  key.push_back(reinterpret_cast<const void*>(static_cast<uintptr_t>(getpid())));
  std::lock_guard<std::mutex> g(mu);
  if (auto pool = open[key].lock()) return pool;
  auto pool = std::make_shared<Pool>(rails, stride);
  open[key] = pool;
  return pool;
}

}  // namespace roce::transport::verbs
