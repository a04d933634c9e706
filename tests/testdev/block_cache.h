#pragma once
// A cache of host memory blocks that follows the stream rules of CUDA's
// caching allocator, shared by the device allocator and the host ("pinned")
// allocator.

#include "testdev.h"

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace testdev {

// Rules, as in CUDA:
// - a block allocated for a stream (its owner) goes back to that stream's
//   free list at once when freed: later work on the owner is ordered after
//   everything queued before the free, so only that stream may reuse it;
// - a block some other stream was recorded on (record_stream) waits until
//   every such stream, and the owner, has finished the work queued at free
//   time; only then is it reusable;
// - blocks without an owner (pinned host memory) are reusable by anyone.
// Freed bytes are overwritten with kPoison, in stream order for the owner,
// so that a stream still reading a block it did not record sees garbage.
//
// Each block is an allocation of its own with an id (as CUDA's
// CU_POINTER_ATTRIBUTE_BUFFER_ID), never reused. Blocks of kMapBytes or more
// are mapped from the kernel and unmapped by release_cached(), and a new
// block of the same size is mapped at the address a released one had: new
// pages at an old address, as CUDA's allocator can hand out after
// empty_cache(), so that a registration of the old pages kept by address is
// caught reaching memory that is no longer the tensor's.
class BlockCache {
 public:
  static constexpr unsigned char kPoison = 0xA5;

  void* allocate(size_t nbytes, Queue* owner);
  void free(void* ptr);
  bool owns(const void* ptr);
  // False if `ptr` is not a live block of this cache.
  bool record_stream(const void* ptr, Queue& stream);
  // Frees the reusable blocks; the caller ensures no queued task uses them.
  // Waits for their poisoning first: a block that became reusable just now
  // has its memset still queued on its owner, and unmapping under it would
  // crash the owner's worker (or poison the next block mapped there).
  void release_cached();
  // The id of the block holding `ptr`, 0 if none does.
  uint64_t buffer_id(const void* ptr);
  static constexpr size_t kMapBytes = 64 << 10;
  std::map<std::string, int64_t> counters();
  void reset_counters();

 private:
  struct Block {
    size_t size;
    Queue* owner;
    std::vector<Queue*> users; // recorded streams other than the owner
  };
  // A freed block and, per stream that must finish first, its last ticket.
  struct Pending {
    void* ptr;
    Block block;
    std::vector<std::pair<Queue*, uint64_t>> waits;
  };
  using FreeKey = std::pair<Queue*, size_t>; // owner, size
  // A reusable block and the owner's ticket of its poisoning (0: done at once).
  struct Cached {
    void* ptr;
    uint64_t poisoned_at;
  };

  void make_reusable(void* ptr, const Block& block);
  void collect_finished();
  void* fresh(size_t size);
  void release(void* ptr, size_t size);

  std::mutex mutex_;
  std::unordered_map<const void*, Block> live_;
  std::map<FreeKey, std::vector<Cached>> free_;
  std::vector<Pending> pending_;
  // Every block, live or cached, by address: its size and id.
  std::map<uintptr_t, std::pair<size_t, uint64_t>> blocks_;
  uint64_t next_id_ = 0;
  // Addresses of released mapped blocks, by size: where new ones go.
  std::map<size_t, std::vector<void*>> holes_;

  int64_t allocations_ = 0; // allocate() calls for a non-zero size
  int64_t fresh_blocks_ = 0; // of those, served by new memory
  int64_t reused_blocks_ = 0; // of those, served from the cache
  int64_t bytes_in_use_ = 0; // rounded sizes of live blocks
  int64_t peak_bytes_in_use_ = 0;
};

} // namespace testdev
