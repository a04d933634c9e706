#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "pinned_cache.hpp"

// Its inline code trips GCC's -Winterference-size; nothing of ours is affected.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winterference-size"
#include <ATen/core/CachingHostAllocator.h>
#pragma GCC diagnostic pop
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>

#include "../common/log.hpp"

namespace roce::adapter {

struct PinnedCache::Block {
  c10::Storage storage;
  size_t bytes = 0;
  c10::DeviceType type = c10::DeviceType::CPU;  // the device type it stages for
  bool inUse = true;
  std::shared_ptr<c10::Event> lastUse;  // completes when its last copies are done
  uint64_t lastTick = 0;                // for least-recently-used eviction

  bool reusable() const { return !inUse && (!lastUse || lastUse->query()); }
};

namespace {

// Sizes are rounded up so that calls of slightly different sizes share
// buffers: 64 KiB at least, then steps of an eighth of the power of two below
// (at most 12.5% of what this cache asks for unused). CUDA's host allocator
// itself caches and rounds each request up to a power of two, so the pinned
// memory behind a buffer can be up to twice its size.
constexpr size_t kMinBlock = 64u << 10;

size_t sizeClass(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  const size_t step = std::max(kMinBlock, std::bit_floor(bytes) / 8);
  return (bytes + step - 1) / step * step;
}

// A cached buffer is handed out for a request it fits without wasting more
// than a quarter of itself (a small call must not pin down a large buffer).
bool fits(size_t have, size_t need) { return have >= need && have - need <= need / 4 + kMinBlock; }

// The device type's pinned-memory allocator, or the pageable CPU allocator
// where none is registered (older torch asserts in debug builds only and
// returns null; newer torch throws).
c10::Allocator* hostAllocatorFor(c10::DeviceType type, bool& pinned) {
  at::HostAllocator* a = nullptr;
  try {
    a = at::getHostAllocator(type);
  } catch (const c10::Error&) {
    a = nullptr;
  }
  pinned = a != nullptr;
  if (pinned) return a;
  static std::atomic<uint64_t> warned{0};  // one bit per device type
  const uint64_t bit = uint64_t{1} << (static_cast<int>(type) % 64);
  if (!(warned.fetch_or(bit) & bit))
    ROCE_WARN("roce: no pinned host allocator is registered for ", c10::DeviceTypeName(type),
              " devices: staging their tensors through pageable host memory, where copies are slower and "
              "may not overlap with the host algorithm");
  return c10::GetCPUAllocator();
}

}  // namespace

PinnedCache::~PinnedCache() {
  for (auto& b : blocks_) {
    if (!b->lastUse) continue;
    try {
      b->lastUse->synchronize();  // no buffer is freed under a queued copy
    } catch (const std::exception& e) {
      ROCE_WARN("roce: waiting for staging copies at group destruction failed: ", e.what());
    }
  }
}

PinnedCache::BlockPtr PinnedCache::acquire(size_t bytes, c10::Device device) {
  const size_t need = sizeClass(bytes);
  std::vector<BlockPtr> freed;  // dropped after the lock, which is released first
  auto claim = [&](const BlockPtr& b) {
    b->inUse = true;
    b->lastUse.reset();
    b->lastTick = ++tick_;
    trim(freed);
  };
  {
    std::lock_guard<std::mutex> g(mu_);
    BlockPtr best;
    for (auto& b : blocks_)
      if (b->type == device.type() && fits(b->bytes, need) && b->reusable() && (!best || b->bytes < best->bytes))
        best = b;
    if (best) {
      ++stats_.reuses;
      claim(best);
      return best;
    }
  }
  bool pinned = true;
  c10::Allocator* alloc = hostAllocatorFor(device.type(), pinned);
  auto fresh = std::make_shared<Block>();
  fresh->storage = c10::Storage(c10::Storage::use_byte_size_t(), need, alloc->allocate(need), /*allocator=*/nullptr,
                                /*resizable=*/false);
  fresh->bytes = need;
  fresh->type = device.type();
  std::lock_guard<std::mutex> g(mu_);
  stats_.pinned = stats_.pinned && pinned;
  ++stats_.allocations;
  blocks_.push_back(fresh);
  claim(fresh);
  return fresh;
}

at::Tensor PinnedCache::view(const BlockPtr& block, int64_t numel, at::ScalarType dtype) {
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype));
  t.set_(block->storage, 0, {numel}, {1});
  return t;
}

void PinnedCache::release(const std::vector<BlockPtr>& blocks, std::shared_ptr<c10::Event> lastUse) {
  std::vector<BlockPtr> freed;  // dropped after the lock, which is released first
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& b : blocks) {
    b->inUse = false;
    b->lastUse = lastUse;
    b->lastTick = ++tick_;
  }
  trim(freed);
}

void PinnedCache::trim(std::vector<BlockPtr>& freed) {
  size_t total = 0;
  for (const auto& b : blocks_) total += b->bytes;
  while (total > limit_) {
    auto victim = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
      if ((*it)->reusable() && (victim == blocks_.end() || (*it)->lastTick < (*victim)->lastTick)) victim = it;
    if (victim == blocks_.end()) return;  // the rest is in use: trimmed on a later call
    total -= (*victim)->bytes;
    freed.push_back(std::move(*victim));  // its storage goes back to its allocator with the last reference
    blocks_.erase(victim);
  }
}

PinnedCache::Stats PinnedCache::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  Stats s = stats_;
  s.blocks = blocks_.size();
  for (const auto& b : blocks_) s.cachedBytes += b->bytes;
  return s;
}

}  // namespace roce::adapter
