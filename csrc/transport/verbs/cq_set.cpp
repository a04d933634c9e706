#include "cq_set.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../../common/error.hpp"
#include "../../common/wakeup.hpp"
#include "verbs_device.hpp"

namespace roce::transport::verbs {
namespace {
// Each new CQ is at least this big (a few dozen peers' queue pairs), so a
// rank with many peers polls a handful of CQs, not one per peer.
constexpr int kMinCqEntries = 4096;
}  // namespace

CqSet::CqSet(VerbsDevice& dev, Wakeup* wake) : dev_(dev), wake_(wake) {}

CqSet::~CqSet() {
  for (auto& c : cqs_) dev_.destroyCq(c.cq);  // events read were acknowledged at once
}

ibv_cq* CqSet::reserve(int entries) {
  if (!cqs_.empty() && cqs_.back().capacity - cqs_.back().reserved >= entries) {
    cqs_.back().reserved += entries;
    return cqs_.back().cq;
  }
  const int size = std::min(std::max(kMinCqEntries, entries), dev_.deviceAttr().max_cqe);
  if (size < entries)
    throwComm(str(dev_.describe(), " allows ", dev_.deviceAttr().max_cqe, " completions per CQ, fewer than the ",
                  entries, " one peer's queue pairs need: lower ROCE_PG_IB_QPS_PER_CONNECTION or ROCE_PG_IB_SLOTS"));
  auto notify = std::make_unique<Notify>();
  notify->owner = this;
  ibv_cq* cq = ibv_create_cq(dev_.context(), size, notify.get(), dev_.completionChannel(), 0);
  if (!cq)
    throwComm(str("ibv_create_cq(", size, ") on ", dev_.describe(), " failed: ", std::strerror(errno),
                  " (if ENOMEM: raise the memlock limit, `ulimit -l unlimited`)"));
  cqs_.push_back({cq, size, entries, std::move(notify)});
  return cq;
}

int CqSet::poll(ibv_wc* wcs, int max) {
  int got = 0;
  for (size_t i = 0; i < cqs_.size() && got < max; ++i) {
    const int n = ibv_poll_cq(cqs_[(next_ + i) % cqs_.size()].cq, max - got, wcs + got);
    if (n < 0) return n;
    got += n;
  }
  if (!cqs_.empty()) next_ = (next_ + 1) % cqs_.size();  // no CQ starves the others
  return got;
}


bool CqSet::arm() {
  if (!dev_.completionChannel()) return false;
  for (auto& c : cqs_) {
    // Still armed, or its event not read yet (which wakes the group): leave it.
    if (c.notify->armed.load(std::memory_order_acquire)) continue;
    // Set before the request: its event may be read (and clear it) at once.
    c.notify->armed.store(true, std::memory_order_relaxed);
    if (ibv_req_notify_cq(c.cq, 0) != 0) {
      c.notify->armed.store(false, std::memory_order_relaxed);
      return false;
    }
  }
  return true;
}

void CqSet::detachWake() {
  dev_.withCqEventsHeld([&] { wake_ = nullptr; });  // Notify::fired runs under that lock
}

void CqSet::Notify::fired() {
  // Release: the reader's ibv_get_cq_event (which advances the arming
  // sequence) happens before the group's next arm() sees false.
  armed.store(false, std::memory_order_release);
  if (owner->wake_) owner->wake_->wake();
}

std::string CqSet::errorOn(const VerbsDevice& dev) const {
  for (const auto& c : cqs_)
    if (std::string e = dev.cqError(c.cq); !e.empty()) return e;
  return {};
}

}  // namespace roce::transport::verbs

