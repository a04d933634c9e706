// The verbs transport's slot bookkeeping (csrc/transport/verbs/slot_pool,
// pool_regions, landing_pool, staging_pool) without a device: pools made on
// no rails register nothing, so what is left is the accounting the
// transport's deadlock freedom rests on: reservations always backed by free
// slots, open slots capped by the largest open share asked, waiters woken
// when a slot comes back, handed staging slots kept for their group, and
// slot ids that name region and index.
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "common/wakeup.hpp"
#include "roce_check.hpp"
#include "transport/verbs/landing_pool.hpp"
#include "transport/verbs/pool_regions.hpp"
#include "transport/verbs/process_pool.hpp"
#include "transport/verbs/slot_pool.hpp"
#include "transport/verbs/staging_pool.hpp"

using roce::transport::verbs::LandingPool;
using roce::transport::verbs::Rails;
using roce::transport::verbs::StagingPool;

namespace {

// A group's wake-up, announced as a blocked wait would: woken() tells
// whether a wake() reached it since, and clears it.
struct Waiter {
  roce::Wakeup w;
  Waiter() { w.announce(); }
  ~Waiter() { w.withdraw(); }
  bool woken() {
    pollfd p{w.fd(), POLLIN, 0};
    if (poll(&p, 1, 0) != 1) return false;
    w.withdraw();  // reads the eventfd (the last waiter clears it)
    w.announce();
    return true;
  }
};

constexpr size_t kStride = 256;

}  // namespace

TEST(slot_pool_takes_and_gives_each_slot_once) {
  roce::transport::verbs::SlotPool pool(Rails{}, 1000, kStride, 0, "test pool", nullptr);
  CHECK_EQ(pool.count(), 3u);  // 1000 / 256
  CHECK_EQ(pool.bytes(), 768u);
  CHECK_EQ(pool.registeredBytes(), 0u);  // no rails: nothing registered
  CHECK_EQ(pool.slot(2) - pool.slot(0), 512);
  std::set<uint32_t> taken;
  while (pool.available()) taken.insert(pool.take());
  CHECK((taken == std::set<uint32_t>{0, 1, 2}));
  CHECK(pool.give(1));
  CHECK(!pool.give(1));  // a double give is ignored
  CHECK_EQ(pool.available(), 1u);
  CHECK_EQ(pool.take(), 1u);
  // Slots are zeroed, writable memory.
  for (uint32_t s = 0; s < 3; ++s) CHECK_EQ(pool.slot(s)[kStride - 1], 0);
  pool.slot(2)[kStride - 1] = 'x';
}

TEST(slot_pool_refuses_fewer_than_two_slots) {
  CHECK_ERROR(Invalid, roce::transport::verbs::SlotPool(Rails{}, 300, kStride, 0, "landing pool", nullptr),
              "the verbs landing pool of 300 bytes holds fewer than two slots of 256 bytes: raise "
              "ROCE_PG_IB_POOL_BYTES or lower ROCE_PG_IB_SLOT_BYTES");
}

TEST(pool_regions_name_slots_by_region_and_index) {
  std::atomic<size_t> bytes{0};
  roce::transport::verbs::PoolRegions regions(Rails{}, kStride, 0, "test", bytes, 3);
  CHECK(regions.add(regions.make(1)));  // at least 2 slots
  CHECK(regions.add(regions.make(3)));
  CHECK_EQ(regions.slots(), 5u);
  std::vector<uint32_t> ids;
  for (uint32_t id; regions.take(&id);) ids.push_back(id);
  REQUIRE_EQ(ids.size(), 5u);
  std::set<uint32_t> second;
  for (uint32_t id : ids) {
    CHECK_LE(id >> roce::transport::verbs::kPoolSlotBits, 1u);
    if (id >> roce::transport::verbs::kPoolSlotBits) second.insert(id & roce::transport::verbs::kPoolSlotMask);
    CHECK(regions.data(id) == regions.region(id).slot(id & roce::transport::verbs::kPoolSlotMask));
  }
  CHECK((second == std::set<uint32_t>{0, 1, 2}));
  CHECK(regions.give(ids[0]));
  CHECK(!regions.give(ids[0]));
  CHECK(regions.add(regions.make(2)));
  CHECK(regions.full());
  CHECK(!regions.add(regions.make(2)));  // dropped, not added
  CHECK_EQ(regions.slots(), 7u);
}

TEST(landing_reservations_stay_backed) {
  LandingPool pool(Rails{}, kStride);
  LandingPool::Share a;
  pool.join(a, 2, 3);  // 2 reserved + 3 open: 5 slots
  CHECK(a.joined);
  CHECK_EQ(a.reserved, 2u);
  CHECK_EQ(pool.openSlots(), 3u);
  CHECK_EQ(pool.openFree(), 3u);
  std::vector<LandingPool::Slot> open(3);
  for (auto& s : open) CHECK(pool.takeOpen(&s));
  LandingPool::Slot extra;
  CHECK(!pool.takeOpen(&extra));  // the two left back the reservation
  CHECK_EQ(pool.openFree(), 0u);
  LandingPool::Slot r1, r2, r3;
  CHECK(pool.takeReserved(a, &r1));
  CHECK(pool.takeReserved(a, &r2));
  CHECK(!pool.takeReserved(a, &r3));  // a holds its whole reservation
  CHECK_EQ(a.held, 2u);
  // Five distinct slots, each with its own bytes.
  std::set<uint32_t> ids{open[0].id, open[1].id, open[2].id, r1.id, r2.id};
  CHECK_EQ(ids.size(), 5u);
  for (uint32_t id : ids) CHECK_EQ(pool.slot(id).addr, reinterpret_cast<uint64_t>(pool.data(id)));
  pool.give(&a, r1.id);
  CHECK_EQ(a.held, 1u);
  CHECK(!pool.takeOpen(&extra));  // a reserved slot given back stays the reservation's
  CHECK(pool.takeReserved(a, &r3));
  pool.give(nullptr, open[0].id);
  CHECK_EQ(pool.openFree(), 1u);
  CHECK(pool.takeOpen(&extra));
}

TEST(landing_keep_leaves_slots_for_others) {
  LandingPool pool(Rails{}, kStride);
  LandingPool::Share a;
  pool.join(a, 1, 4);
  LandingPool::Slot s;
  CHECK(pool.takeOpen(&s, 2));   // 4 free > 2
  CHECK(pool.takeOpen(&s, 2));   // 3 free > 2
  CHECK(!pool.takeOpen(&s, 2));  // 2 free: keep them
  CHECK(pool.takeOpen(&s, 0));
}

TEST(landing_waiter_is_woken_when_an_open_slot_comes_back) {
  LandingPool pool(Rails{}, kStride);
  LandingPool::Share a;
  pool.join(a, 0, 2);
  LandingPool::Slot s1, s2, s3;
  CHECK(pool.takeOpen(&s1) && pool.takeOpen(&s2));
  Waiter group;
  CHECK(!pool.takeOpen(&s3, 0, &group.w));
  CHECK(!group.woken());
  const uint64_t before = pool.wakeups();
  pool.give(nullptr, s1.id);
  CHECK(group.woken());
  CHECK_GT(pool.wakeups(), before);
  CHECK_EQ(pool.openFree(), 1u);  // published before the wake-up
  // A forgotten group is not woken any more.
  Waiter gone;
  CHECK(pool.takeOpen(&s3));
  CHECK(!pool.takeOpen(&s1, 0, &gone.w));
  pool.forget(&gone.w);
  pool.give(nullptr, s2.id);
  CHECK(!gone.woken());
}

TEST(landing_pool_grows_by_each_joining_group) {
  LandingPool pool(Rails{}, kStride);
  LandingPool::Share a, b, c;
  pool.join(a, 4, 8);  // 12 slots
  LandingPool::Slot s;
  int open = 0;
  while (pool.takeOpen(&s)) ++open;
  CHECK_EQ(open, 8);
  // b asks less open than a: only its reservation is added, and the open
  // share stays the largest asked (8), all of it taken.
  pool.join(b, 3, 2);
  CHECK_EQ(pool.openSlots(), 8u);
  CHECK(!pool.takeOpen(&s));
  // Both reservations taken: region 0's 12 slots and the 3 b's join added.
  LandingPool::Slot r;
  int inSecond = 0;
  for (int i = 0; i < 3; ++i) CHECK(pool.takeReserved(b, &r)), inSecond += (r.id >> roce::transport::verbs::kPoolSlotBits) == 1;
  for (int i = 0; i < 4; ++i) CHECK(pool.takeReserved(a, &r)), inSecond += (r.id >> roce::transport::verbs::kPoolSlotBits) == 1;
  CHECK_EQ(inSecond, 3);
  CHECK(!pool.takeReserved(a, &r) && !pool.takeReserved(b, &r));
  // c widens the open share: waiters are woken, two more open slots.
  Waiter w;
  CHECK(!pool.takeOpen(&s, 0, &w.w));
  pool.join(c, 1, 10);
  CHECK(w.woken());
  CHECK_EQ(pool.openSlots(), 10u);
  CHECK_EQ(pool.openFree(), 2u);
}

TEST(landing_leave_returns_the_reservation) {
  LandingPool pool(Rails{}, kStride);
  LandingPool::Share a, b;
  pool.join(a, 2, 1);  // 3 slots
  pool.join(b, 2, 1);  // 5 slots
  LandingPool::Slot held;
  CHECK(pool.takeReserved(b, &held));
  pool.leave(b);  // still holding one: lost to the pool
  CHECK(!b.joined);
  CHECK_EQ(b.reserved, 0u);
  // a's reservation (2) and the open slot are still backed; the one b
  // still held is gone for good, the other of b's two is free to take again.
  LandingPool::Slot s;
  CHECK(pool.takeOpen(&s));
  CHECK(!pool.takeOpen(&s));
  CHECK(pool.takeReserved(a, &s) && pool.takeReserved(a, &s));
  pool.leave(b);  // twice: nothing
}

TEST(landing_pool_refuses_to_grow_past_its_regions) {
  LandingPool pool(Rails{}, kStride);
  std::vector<LandingPool::Share> shares(2 * LandingPool::kMaxRegions + 2);
  size_t joined = 0;
  auto joinAll = [&] {
    for (; joined < shares.size(); ++joined) pool.join(shares[joined], 1, 0);
  };
  CHECK_ERROR(Invalid, joinAll(), "the verbs landing pool of this process has grown 1024 times");
  CHECK_ERROR(Invalid, joinAll(), "destroy process groups that are no longer used");
  // Every region holds two slots (the least a region has): 2048 reservations fit.
  CHECK_EQ(joined, 2u * LandingPool::kMaxRegions);
}

TEST(staging_pool_hands_slots_to_queued_groups_first) {
  StagingPool pool(Rails{}, kStride);
  pool.reserve(3);
  std::vector<StagingPool::Slot> slots(3);
  Waiter a, b;
  for (auto& s : slots) CHECK(pool.tryTake(&s, &a.w));
  CHECK(slots[0].data != slots[1].data && slots[1].data != slots[2].data);
  StagingPool::Slot s;
  CHECK(!pool.tryTake(&s, &a.w));  // a queues
  CHECK(!pool.tryTake(&s, &b.w));  // then b
  pool.give(slots[0].id);          // to a, the first queued
  CHECK(a.woken());
  CHECK(!b.woken());
  CHECK(!pool.tryTake(&s, &b.w));  // b cannot take a's slot at once
  CHECK(pool.tryTake(&s, &a.w));
  CHECK_EQ(s.id, slots[0].id);
  pool.give(slots[1].id);  // to b
  CHECK(b.woken());
  CHECK(pool.tryTake(&s, nullptr) == false);  // handed, less than a millisecond ago
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  CHECK(pool.tryTake(&s, nullptr));  // unclaimed for a millisecond: anyone's
  CHECK_EQ(s.id, slots[1].id);
}

TEST(staging_forget_passes_handed_slots_on) {
  StagingPool pool(Rails{}, kStride);
  pool.reserve(2);
  StagingPool::Slot x, y, s;
  Waiter a, b;
  CHECK(pool.tryTake(&x, nullptr) && pool.tryTake(&y, nullptr));
  CHECK(!pool.tryTake(&s, &a.w));
  CHECK(!pool.tryTake(&s, &b.w));
  pool.give(x.id);  // handed to a
  CHECK(a.woken());
  pool.forget(&a.w);  // a goes: its slot goes to b
  CHECK(b.woken());
  CHECK(pool.tryTake(&s, &b.w));
  CHECK_EQ(s.id, x.id);
  pool.forget(&b.w);
  pool.give(y.id);  // nobody queued: free
  CHECK(!a.woken() && !b.woken());
  CHECK(pool.tryTake(&s, nullptr));
}

TEST(staging_reserve_grows_and_serves_the_queue) {
  StagingPool pool(Rails{}, kStride);
  pool.reserve(2);
  StagingPool::Slot s;
  CHECK(pool.tryTake(&s, nullptr) && pool.tryTake(&s, nullptr));
  Waiter q;
  CHECK(!pool.tryTake(&s, &q.w));
  pool.reserve(5);  // a region of 3 more: the queued group is served first
  CHECK(q.woken());
  CHECK(pool.tryTake(&s, &q.w));
  CHECK_EQ(s.id >> roce::transport::verbs::kPoolSlotBits, 1u);
  int more = 0;
  while (pool.tryTake(&s, nullptr)) ++more;
  CHECK_EQ(more, 2);
  pool.reserve(4);  // already holds more: nothing
  CHECK(!pool.tryTake(&s, nullptr));
  // Ids fit a work request id's 24 bits: at most 16 regions.
  for (uint32_t n = 6; n < 64; n += 2) pool.reserve(n);
  uint32_t top = 0;
  while (pool.tryTake(&s, nullptr)) top = std::max(top, s.id);
  CHECK_LT(top, 1u << 24);
  CHECK_EQ(top >> roce::transport::verbs::kPoolSlotBits, static_cast<uint32_t>(StagingPool::kMaxRegions - 1));
}

TEST(process_pool_is_shared_per_rails_and_stride) {
  auto a = roce::transport::verbs::processPool<StagingPool>(Rails{}, kStride);
  auto b = roce::transport::verbs::processPool<StagingPool>(Rails{}, kStride);
  auto c = roce::transport::verbs::processPool<StagingPool>(Rails{}, 2 * kStride);
  CHECK(a == b);
  CHECK(a != c);
  const StagingPool* first = a.get();
  a.reset();
  b.reset();  // the last holder gone: the next asks get a new pool
  auto d = roce::transport::verbs::processPool<StagingPool>(Rails{}, kStride);
  CHECK(d != nullptr);
  (void)first;
  CHECK_EQ(StagingPool::processBytes(), 0u);  // no rails: nothing registered
  CHECK_EQ(LandingPool::processBytes(), 0u);
}
