// Memory registrations of user buffers for zero-copy RDMA, cached by
// allocation (see BufferOwner in transport.hpp).
//
// Why keyed by allocation and holding a reference: an MR pins the physical
// pages it was made on. If the memory were freed and the address reused (glibc
// unmaps and remaps large tensors, often at the same address), a cache keyed
// by address would hand out an MR that still points at the old pages, and data
// would silently go to or come from the wrong place. Here every entry of host
// memory keeps its allocation alive (BufferOwner::keep), so while an MR exists
// its memory cannot be freed; an entry is dropped by deregistering first, then
// letting go of the reference. DDP buckets, FSDP flat parameters and the
// Communicator's scratch buffers persist across steps, so in steady state
// nothing is registered. Device memory's owners hold it weakly (transport.hpp):
// the allocation object, the key, cannot be reused while an entry exists, so
// an entry whose tensor died is never handed out again; it keeps no memory
// allocated, only its registration, which goes at the cache's next
// registration (dropReleased).
//
// Bounded: at most `limitBytes` registered (ROCE_PG_IB_REG_CACHE_BYTES),
// summed over the rails (each rail's registration pins the pages again).
// Entries in use by an in-flight transfer are never dropped; among the rest,
// allocations nobody but the cache refers to any more go first, then the least
// recently used. When nothing fits, acquire() returns null and the transport
// copies through its staging slots instead. Single-threaded (progress thread).
#pragma once
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include "../transport.hpp"
#include "memory_region.hpp"

namespace roce::transport::verbs {

class RegCache {
 public:
  // One registration per rail (memory_region.hpp): a queue pair on rail r uses mr[r].
  struct Entry {
    BufferOwner owner;
    std::array<ibv_mr*, kMaxRails> mr{};
    int inUse = 0;  // transfers currently using the MRs
    uint32_t lkey(int rail) const { return mr[rail]->lkey; }
    uint32_t rkey(int rail) const { return mr[rail]->rkey; }
  };

  // overcommit (device memory): a buffer within the limit is never refused
  // for lack of room; entries in use may push the total over the limit until
  // they are released. The adapter chose the direct path for such a buffer
  // before the call was issued, and the CPU cannot copy it instead.
  RegCache(Rails rails, size_t limitBytes, int rank, bool overcommit = false);
  ~RegCache();
  RegCache(const RegCache&) = delete;
  RegCache& operator=(const RegCache&) = delete;

  // An MR covering [p, p + n), which must lie inside `o`, marked in use; or
  // null when the buffer cannot be registered now (over the limit with
  // everything in use, or ibv_reg_mr failed): the caller copies instead.
  Entry* acquire(const BufferOwner& o, const void* p, size_t n);
  void release(Entry* e);
  // Deregisters entries not in use whose buffers only the cache still refers
  // to (their tensors were freed): the cache's reference keeps host memory
  // allocated; device memory went back to its allocator already.
  void dropReleased();

  void setCounters(Counters* c) { counters_ = c; }
  size_t entries() const { return lru_.size(); }
  size_t bytes() const { return bytes_; }
  size_t limit() const { return limit_; }

 private:
  using Iter = std::list<Entry>::iterator;
  void drop(Iter it);
  bool makeRoom(size_t need);
  // Registers `o` on every rail; false (errno kept, `failed` naming the rail) if any refused.
  bool registerOnRails(const BufferOwner& o, int access, std::array<ibv_mr*, kMaxRails>& mrs, size_t& failed);
  ibv_mr* registerDmabuf(VerbsDevice& dev, const BufferOwner& o, int access);  // null: by pointer instead
  // What a registration costs against the limit: host pages are pinned (and
  // charged to ulimit -l) once per rail; device memory (peer memory, dma-buf)
  // is not locked memory, and the adapter sized its direct path against
  // ROCE_PG_IB_DEVICE_REG_BYTES per buffer: counted once.
  size_t pinned(const BufferOwner& o) const { return overcommit_ ? o.len : o.len * rails_.size(); }

  Rails rails_;
  size_t limit_;
  int rank_;
  bool overcommit_;
  size_t bytes_ = 0;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<const void*, Iter> byId_;
  Counters* counters_ = nullptr;
  bool warnedRegFailure_ = false;
  bool warnedDmabufFailure_ = false;
};

// ROCE_PG_IB_REG_CACHE_BYTES when set; else 1 GiB, at most half the
// locked-memory limit (RLIMIT_MEMLOCK) so the staging pools still fit.
size_t defaultRegCacheBytes(size_t configured);

}  // namespace roce::transport::verbs
