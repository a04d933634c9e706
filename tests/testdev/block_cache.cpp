// The stream-aware block cache; the rules are in block_cache.h.

#include "block_cache.h"

#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace testdev {
namespace {

// Sizes that differ a little share blocks, as in CUDA's allocator.
constexpr size_t kRound = 512;
// c10's CPU alignment: the kernels run by CPU code vectorize on it.
constexpr size_t kAlignment = 64;

size_t rounded(size_t nbytes) {
  return (nbytes + kRound - 1) / kRound * kRound;
}

} // namespace

void* BlockCache::fresh(size_t size) {
  void* ptr = nullptr;
  if (size < kMapBytes) {
    ptr = std::aligned_alloc(kAlignment, size);
  } else {
    auto& holes = holes_[size];
    while (ptr == nullptr && !holes.empty()) {
      void* hint = holes.back();
      holes.pop_back();
      void* got = mmap(
          hint,
          size,
          PROT_READ | PROT_WRITE,
          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
          -1,
          0);
      if (got == hint) {
        ptr = got;
      } else if (got != MAP_FAILED) {
        munmap(got, size); // a kernel before 4.17 took the hint as a hint
      }
    }
    if (ptr == nullptr) {
      ptr = mmap(
          nullptr,
          size,
          PROT_READ | PROT_WRITE,
          MAP_PRIVATE | MAP_ANONYMOUS,
          -1,
          0);
      ptr = ptr == MAP_FAILED ? nullptr : ptr;
    }
  }
  TORCH_CHECK(ptr != nullptr, "testdev: out of host memory (", size, " B)");
  blocks_[reinterpret_cast<uintptr_t>(ptr)] = {size, ++next_id_};
  return ptr;
}

void BlockCache::release(void* ptr, size_t size) {
  blocks_.erase(reinterpret_cast<uintptr_t>(ptr));
  if (size < kMapBytes) {
    std::free(ptr);
    return;
  }
  munmap(ptr, size);
  holes_[size].push_back(ptr);
}

uint64_t BlockCache::buffer_id(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin()) {
    return 0;
  }
  --it;
  return p < it->first + it->second.first ? it->second.second : 0;
}

void* BlockCache::allocate(size_t nbytes, Queue* owner) {
  const size_t size = rounded(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  collect_finished();
  void* ptr = nullptr;
  auto it = free_.find({owner, size});
  if (it != free_.end() && !it->second.empty()) {
    // Most recently freed first, so a test knows which block comes back.
    ptr = it->second.back().ptr; // its poisoning is ahead of it on the owner
    it->second.pop_back();
    ++reused_blocks_;
  } else {
    ptr = fresh(size);
    ++fresh_blocks_;
  }
  ++allocations_;
  live_.emplace(ptr, Block{size, owner, {}});
  bytes_in_use_ += size;
  peak_bytes_in_use_ = std::max(peak_bytes_in_use_, bytes_in_use_);
  return ptr;
}

void BlockCache::free(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  TORCH_INTERNAL_ASSERT(it != live_.end(), "testdev: freeing unknown block");
  Block block = std::move(it->second);
  live_.erase(it);
  bytes_in_use_ -= block.size;
  if (block.users.empty()) {
    make_reusable(ptr, block);
    return;
  }
  Pending pending{ptr, block, {}};
  for (Queue* user : block.users) {
    pending.waits.emplace_back(user, user->last_ticket());
  }
  if (block.owner != nullptr) {
    pending.waits.emplace_back(block.owner, block.owner->last_ticket());
  }
  pending_.push_back(std::move(pending));
}

void BlockCache::make_reusable(void* ptr, const Block& block) {
  // Poisoning in the owner's order keeps the owner's own queued readers
  // correct; the block is on the free list before anyone can queue more.
  const size_t size = block.size;
  uint64_t poisoned_at = 0;
  if (block.owner != nullptr) {
    poisoned_at = block.owner->enqueue(
        [ptr, size] { std::memset(ptr, kPoison, size); });
  } else {
    std::memset(ptr, kPoison, size);
  }
  free_[{block.owner, size}].push_back({ptr, poisoned_at});
}

void BlockCache::collect_finished() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    const bool finished = std::all_of(
        it->waits.begin(), it->waits.end(), [](const auto& wait) {
          return wait.first->reached(wait.second);
        });
    if (finished) {
      make_reusable(it->ptr, it->block);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

bool BlockCache::owns(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_.count(ptr) != 0;
}

bool BlockCache::record_stream(const void* ptr, Queue& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    return false;
  }
  Block& block = it->second;
  if (&stream != block.owner &&
      std::find(block.users.begin(), block.users.end(), &stream) ==
          block.users.end()) {
    block.users.push_back(&stream);
  }
  return true;
}

void BlockCache::release_cached() {
  std::map<FreeKey, std::vector<Cached>> doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collect_finished();
    doomed.swap(free_);
  }
  // Outside the lock: a task ahead of the memset may free a block itself.
  for (const auto& [key, blocks] : doomed) {
    for (const Cached& block : blocks) {
      if (key.first != nullptr) {
        key.first->wait(block.poisoned_at);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, blocks] : doomed) {
    for (const Cached& block : blocks) {
      release(block.ptr, key.second);
    }
  }
}

std::map<std::string, int64_t> BlockCache::counters() {
  std::lock_guard<std::mutex> lock(mutex_);
  collect_finished();
  int64_t cached = 0;
  for (const auto& [key, blocks] : free_) {
    cached += static_cast<int64_t>(blocks.size());
  }
  return {
      {"allocations", allocations_},
      {"fresh_blocks", fresh_blocks_},
      {"reused_blocks", reused_blocks_},
      {"bytes_in_use", bytes_in_use_},
      {"peak_bytes_in_use", peak_bytes_in_use_},
      {"pending_blocks", static_cast<int64_t>(pending_.size())},
      {"cached_blocks", cached},
  };
}

void BlockCache::reset_counters() {
  std::lock_guard<std::mutex> lock(mutex_);
  allocations_ = fresh_blocks_ = reused_blocks_ = 0;
  peak_bytes_in_use_ = bytes_in_use_;
}

} // namespace testdev
