// Host staging buffers for device tensors, kept per process group.
//
// A collective on device tensors copies them into host memory, runs the host
// algorithm there and copies the results back (device_staging.hpp). The
// buffers are pinned (page-locked) where the device's host allocator exists
// (at::getHostAllocator: CUDA, ROCm, a PrivateUse1 device that registers one),
// so that the copies are asynchronous DMA; elsewhere they are pageable CPU
// memory (logged once). Allocating pinned memory is slow (the pages are locked
// one by one), so buffers are reused: a buffer goes back to the cache with the
// event that ends the last operation using it and is handed out again only
// once that event has completed.
//
// Bounded: buffers nobody uses are kept up to `limitBytes`
// (ROCE_PG_DEVICE_STAGING_CACHE_BYTES), least recently used first out. Buffers
// that still serve an operation, or whose last copies are still queued on the
// device, are never freed; they may push the total above the limit until they
// are released and their event completes, and the next acquire() or release()
// trims them. The limit bounds what this cache holds: a device's host
// allocator may keep freed pinned memory in its own cache (CUDA's does, and
// rounds to powers of two), which this cache neither sees nor frees.
// A stable set of buffers is also what the verbs registration
// cache needs to keep its memory registrations (one c10::Storage per buffer).
//
// Thread-safe: the caller's thread acquires, the progress thread releases.
// Pinning new memory (slow: CUDA pins page by page) and freeing it happen
// outside the lock, so a call that pins never holds up the progress thread
// releasing the buffers of the calls before it.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace roce::adapter {

class PinnedCache {
 public:
  struct Block;
  using BlockPtr = std::shared_ptr<Block>;

  explicit PinnedCache(size_t limitBytes) : limit_(limitBytes) {}
  // Waits for the copies still using cached buffers, then frees them.
  ~PinnedCache();
  PinnedCache(const PinnedCache&) = delete;
  PinnedCache& operator=(const PinnedCache&) = delete;

  // A buffer of at least `bytes` bytes staging tensors of `device`'s type, in
  // use until released.
  BlockPtr acquire(size_t bytes, c10::Device device);
  // A contiguous CPU tensor of `numel` elements of `dtype` at the start of
  // `block` (sharing its storage, so zero-copy transports see one allocation).
  static at::Tensor view(const BlockPtr& block, int64_t numel, at::ScalarType dtype);
  // Hands blocks back; each becomes reusable once `lastUse` has completed.
  void release(const std::vector<BlockPtr>& blocks, std::shared_ptr<c10::Event> lastUse);

  struct Stats {
    uint64_t allocations = 0;  // buffers allocated from the host allocator
    uint64_t reuses = 0;       // acquire() served from the cache
    size_t cachedBytes = 0;    // every buffer held now, in use or not
    size_t blocks = 0;
    bool pinned = true;        // false once a device type had no host allocator
  };
  Stats stats() const;

 private:
  // Frees idle blocks whose last use completed, least recently used first,
  // until the cache is within its limit. Under mu_.
  // Moves idle blocks beyond the limit into `freed`, least recently used
  // first; the caller drops them after releasing mu_ (freeing pinned memory
  // may be slow, and the other thread needs the lock).
  void trim(std::vector<BlockPtr>& freed);

  const size_t limit_;
  mutable std::mutex mu_;
  std::vector<BlockPtr> blocks_;
  uint64_t tick_ = 0;
  Stats stats_;
};

}  // namespace roce::adapter
