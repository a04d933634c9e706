#include "cq_set.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../../common/error.hpp"
#include "verbs_device.hpp"

namespace roce {
namespace {
// Each new CQ is at least this big (a few dozen peers' queue pairs), so a
// rank with many peers polls a handful of CQs, not one per peer.
constexpr int kMinCqEntries = 4096;
}  // namespace

CqSet::CqSet(VerbsDevice& dev) : dev_(dev) {
  channel_ = ibv_create_comp_channel(dev_.context());
  if (channel_) {
    // Non-blocking, so that consuming an event never blocks the progress thread.
    const int fl = fcntl(channel_->fd, F_GETFL);
    if (fl < 0 || fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
      ibv_destroy_comp_channel(channel_);
      channel_ = nullptr;  // waits then poll instead of blocking
    }
  }
}

CqSet::~CqSet() {
  for (auto& c : cqs_) {
    if (c.unacked) ibv_ack_cq_events(c.cq, c.unacked);
    ibv_destroy_cq(c.cq);
    dev_.forget(c.cq);
  }
  if (channel_) ibv_destroy_comp_channel(channel_);
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
  ibv_cq* cq = ibv_create_cq(dev_.context(), size, nullptr, channel_, 0);
  if (!cq)
    throwComm(str("ibv_create_cq(", size, ") on ", dev_.describe(), " failed: ", std::strerror(errno),
                  " (if ENOMEM: raise the memlock limit, `ulimit -l unlimited`)"));
  cqs_.push_back({cq, size, entries, 0});
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
  if (!channel_) return false;
  // Re-arming an armed CQ is harmless.
  for (auto& c : cqs_)
    if (ibv_req_notify_cq(c.cq, 0) != 0) return false;
  return true;
}

void CqSet::consumeEvents() {
  if (!channel_) return;
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (ibv_get_cq_event(channel_, &cq, &ctx) == 0) {  // EAGAIN ends it
    for (auto& c : cqs_)
      if (c.cq == cq) {
        // Acknowledged in batches: each ack takes a lock in the provider.
        if (++c.unacked >= 64) {
          ibv_ack_cq_events(c.cq, c.unacked);
          c.unacked = 0;
        }
      }
  }
}

std::string CqSet::errorOn(const VerbsDevice& dev) const {
  for (const auto& c : cqs_)
    if (std::string e = dev.cqError(c.cq); !e.empty()) return e;
  return {};
}

}  // namespace roce

