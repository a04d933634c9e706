// The landing slots peers write chunks into: one pool per process for each
// set of rails and slot size, which every group of the process shares, so
// an extra group registers a few slots, not a pool of its own.
//
// Why a group needs slots of its own here (staging does not, see
// staging_pool.hpp): a landing slot is granted to a peer for a receive
// before the peer's matching send may exist, and comes back only once the
// peer wrote into it. A peer busy in another group's operation holds the
// slots it was granted meanwhile. Were every slot held that way, a group
// could wait for slots that come back only after a peer finishes an
// operation that waits for this group: a cycle between groups. So each
// group joins with a reservation of one slot per peer (up to
// kMaxReservedPerGroup), which the group grants to each peer for good
// (verbs_grants.cpp): every peer of every group always has a credit,
// whatever the other groups hold, and keeps moving (one chunk per round
// trip at worst). The rest of the pool ("open" slots) goes to whoever asks:
// further standing grants for eager messages and demand grants, at most the
// most any member asked for (`open` in join) at once, which is what keeps
// every reservation backed by a free slot. A group that wanted an open slot
// and found none is woken when one is given back (its peers beyond the
// reservation, in a group of more peers than kMaxReservedPerGroup, may
// have no credit until then).
//
// Size: the members' reservations plus the largest open share any of them
// asked for - registered once, by the first group; a further group of the
// same shape adds only its reservation (one region of that many slots). The
// pool never shrinks while it lives, so creating and destroying groups of
// one shape registers nothing new.
//
// Slots are addressed by id (region in bits 20-29, slot in bits 0-19: the
// 32-bit immediate of the write that fills it). Because the pool grows by
// regions, each registered separately, a grant carries the slot's address
// and its rkey per rail (verbs_wire.hpp, kCredit) instead of a peer
// computing them from a base.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "memory_region.hpp"
#include "pool_regions.hpp"
#include "port_choice.hpp"

namespace roce {
class Wakeup;
}
namespace roce::transport::verbs {


class LandingPool {
 public:
  // The process's pool for `rails` (in this order: rkeys are per rail index)
  // and slots of `stride` bytes; created on first use.
  static std::shared_ptr<LandingPool> shared(const Rails& rails, size_t stride);
  // Registered bytes of every landing pool of the process (runtime stats).
  static size_t processBytes();

  static constexpr uint32_t kMaxReservedPerGroup = 64;
  static constexpr int kMaxRegions = 1024;

  LandingPool(Rails rails, size_t stride);
  ~LandingPool() = default;
  LandingPool(const LandingPool&) = delete;
  LandingPool& operator=(const LandingPool&) = delete;

  // A member group's reservation (touched only under the pool's lock).
  struct Share {
    uint32_t reserved = 0;  // slots it may always take
    uint32_t held = 0;      // of those, taken
    bool joined = false;
  };
  // Joins with `reserved` slots and asks that `open` slots be open to all;
  // grows the pool as needed. Throws (memlock) leaving pool and share as they were.
  void join(Share& share, uint32_t reserved, uint32_t open);
  // Leaves; its slots must have been given back (the reservation goes;
  // a reserved slot still held is lost to the pool for good).
  void leave(Share& share);

  struct Slot {
    uint32_t id = 0;
    uint64_t addr = 0;
    uint32_t rkey[kMaxRails] = {};  // per rail
  };
  // An open slot, if more than `keep` are free; else false, and `waiter`
  // (a group's wake-up; may be null) is woken when an open slot is given
  // back or a reservation goes.
  bool takeOpen(Slot* slot, uint32_t keep = 0, Wakeup* waiter = nullptr);
  // A group going: its wake-up is not called any more.
  void forget(Wakeup* waiter);
  // One of `share`'s reserved slots; false when it holds all of them.
  bool takeReserved(Share& share, Slot* slot);
  // Gives back a slot; `share` non-null for one taken by takeReserved.
  void give(Share* share, uint32_t id);
  // Where a slot's bytes are. Lock-free: the slot's region was published
  // before the id was handed out, and regions never move or go while the
  // pool lives.
  // Ids come from peers' immediates: the group checks that it granted the
  // id before asking.
  char* data(uint32_t id) const;
  Slot slot(uint32_t id) const;  // a taken slot's address and rkeys (lock-free, as data())

  // Lock-free snapshots as of the pool's last change, for a group's hot path
  // (every consumed chunk, every progress round while a peer waits for
  // slots): they say whether trying is worth it; taking a slot checks again
  // under the lock. A group that found no open slot is woken after the
  // snapshot counts the slot given back.
  uint32_t openSlots() const { return openMaxNow_.load(std::memory_order_acquire); }  // largest open share asked
  uint32_t openFree() const { return openFreeNow_.load(std::memory_order_acquire); }  // open slots free
  // Bumped whenever the groups waiting for an open slot are woken (a slot
  // given back, a reservation gone, the open share raised): a group retries
  // its waiting peers when this changed since it last tried, so a wake-up
  // it lost to a faster group still makes it try - and, failing, wait again.
  uint64_t wakeups() const { return wakeupsNow_.load(std::memory_order_acquire); }

 private:
  uint32_t total() const;        // under mu_: usable slots (registered, less lost ones)
  void wakeWaiting();            // under mu_
  uint32_t openFreeLocked() const;  // under mu_
  uint32_t takeAny();            // under mu_; requires a free slot (the accounting says so)
  void publish();                // under mu_: the snapshots, after every change

  const size_t rails_;            // how many rails a slot has an rkey on
  std::mutex growMu_;  // one join grows the pool at a time (no two groups register the same need)
  mutable std::mutex mu_;
  PoolRegions regions_;
  uint32_t free_ = 0;             // free slots in all regions
  uint32_t reservedSum_ = 0;      // members' reservations
  uint32_t reservedUnused_ = 0;   // members' reservations not taken
  uint32_t openMax_ = 0;          // the largest open share any member asked for
  uint32_t openHeld_ = 0;         // open slots taken
  uint32_t lost_ = 0;             // reserved slots a leaving member still held
  std::vector<Wakeup*> waiting_;  // groups that found no open slot
  std::atomic<uint32_t> openMaxNow_{0};
  std::atomic<uint32_t> openFreeNow_{0};
  std::atomic<uint64_t> wakeupsNow_{0};
};

}  // namespace roce::transport::verbs
