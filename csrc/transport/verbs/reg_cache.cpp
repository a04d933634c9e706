#include "reg_cache.hpp"

#include <cstdint>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "../../common/error.hpp"
#include "../../common/log.hpp"
#include "dmabuf.hpp"
#include "verbs_device.hpp"

namespace roce::transport::verbs {

size_t defaultRegCacheBytes(size_t configured) {
  if (configured != 0) return configured;
  size_t limit = size_t(1) << 30;
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    limit = std::min(limit, static_cast<size_t>(rl.rlim_cur / 2));
  return limit;
}

RegCache::RegCache(Rails rails, size_t limitBytes, int rank, bool overcommit)
    : rails_(std::move(rails)), limit_(limitBytes), rank_(rank), overcommit_(overcommit) {}

RegCache::~RegCache() {
  // The owner of this cache destroys its queue pairs first: nothing can use
  // these MRs any more.
  while (!lru_.empty()) drop(std::prev(lru_.end()));
}

void RegCache::drop(Iter it) {
  // Deregister before letting go of the memory: once ibv_dereg_mr returns the
  // NIC can no longer reach the pages, and only then may they be freed.
  for (ibv_mr* mr : it->mr)
    if (mr) ibv_dereg_mr(mr);
  bytes_ -= pinned(it->owner);
  if (counters_) counters_->cachedMrs.fetch_sub(1, std::memory_order_relaxed);
  auto byId = byId_.find(it->owner.id);
  if (byId != byId_.end() && byId->second == it) byId_.erase(byId);
  lru_.erase(it);  // drops the reference (may free the memory here)
}

static bool onlyCacheRefers(const BufferOwner& o) {
  // Requests copy the owner, so a use_count above 1 means one still holds it.
  return o.keep.use_count() == 1 && (!o.released || o.released(o.keep.get()));
}

void RegCache::dropReleased() {
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (it->inUse == 0 && onlyCacheRefers(it->owner)) drop(it);
    it = next;
  }
}

bool RegCache::makeRoom(size_t need) {
  if (need > limit_) return false;
  dropReleased();
  for (auto it = lru_.end(); bytes_ + need > limit_ && it != lru_.begin();) {
    --it;
    if (it->inUse == 0) {
      auto victim = it++;
      drop(victim);
    }
  }
  return overcommit_ || bytes_ + need <= limit_;
}

RegCache::Entry* RegCache::acquire(const BufferOwner& o, const void* p, size_t n) {
  if (!o.covers(p, n)) return nullptr;
  auto found = byId_.find(o.id);
  if (found != byId_.end()) {
    Iter it = found->second;
    if (it->owner.base == o.base && it->owner.len == o.len && it->owner.bufferId == o.bufferId) {
      lru_.splice(lru_.begin(), lru_, it);  // most recently used
      it->inUse++;
      return &*it;
    }
    // The same allocation object now describes other memory (a storage whose
    // data pointer was swapped, or given new memory at the same address: the
    // buffer id changed): the old registration is of no use.
    if (it->inUse > 0) return nullptr;
    drop(it);
  }
  if (!makeRoom(pinned(o))) return nullptr;
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  std::array<ibv_mr*, kMaxRails> mrs{};
  size_t failed = 0;
  bool ok = registerOnRails(o, access, mrs, failed);
  if (!ok && (errno == ENOMEM || errno == EAGAIN) && !lru_.empty()) {
    // Locked memory ran out: give back what is not in use and try once more.
    for (auto it = lru_.begin(); it != lru_.end();) {
      auto next = std::next(it);
      if (it->inUse == 0) drop(it);
      it = next;
    }
    ok = registerOnRails(o, access, mrs, failed);
  }
  const VerbsDevice& dev = *rails_[failed];
  if (!ok && o.device) {
    // The request fails with the remedy (VerbsTransport::deviceRegFailure);
    // the errno is the provider's answer for device memory.
    ROCE_WARN("rank ", rank_, ": ibv_reg_mr of ", o.len >> 10, " KiB of device memory on ", dev.describe(),
              " failed (", std::strerror(errno), "): is the peer-memory module (nvidia_peermem) loaded?");
    return nullptr;
  }
  if (!ok) {
    if (!warnedRegFailure_) {
      warnedRegFailure_ = true;
      rlimit rl{};
      getrlimit(RLIMIT_MEMLOCK, &rl);
      ROCE_WARN("rank ", rank_, ": ibv_reg_mr of a ", o.len >> 10, " KiB tensor on ", dev.describe(),
                " failed (", std::strerror(errno), "); large messages fall back to copying through staging. "
                "The locked-memory limit (ulimit -l) is ",
                rl.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : str(rl.rlim_cur >> 10, " KiB"),
                ": raise it (`ulimit -l unlimited`, `docker run --ulimit memlock=-1`) or lower "
                "ROCE_PG_IB_REG_CACHE_BYTES (now ", limit_, ")");
    }
    return nullptr;
  }
  if (counters_) {
    Counters::add(counters_->registrations, 1);
    counters_->cachedMrs.fetch_add(1, std::memory_order_relaxed);
  }
  lru_.push_front(Entry{o, mrs, 1});
  bytes_ += pinned(o);
  byId_[o.id] = lru_.begin();
  return &lru_.front();
}

bool RegCache::registerOnRails(const BufferOwner& o, int access, std::array<ibv_mr*, kMaxRails>& mrs,
                               size_t& failed) {
  for (size_t r = 0; r < rails_.size(); ++r) {
    VerbsDevice& dev = *rails_[r];
    ibv_mr* mr = o.exportDmabuf ? registerDmabuf(dev, o, access) : nullptr;
    if (!mr) mr = ibv_reg_mr(dev.pd(), o.base, o.len, access);
    if (!mr) {
      const int e = errno;
      for (size_t d = 0; d < r; ++d) ibv_dereg_mr(mrs[d]);
      mrs = {};
      failed = r;
      errno = e;
      return false;
    }
    mrs[r] = mr;
  }
  return true;
}

ibv_mr* RegCache::registerDmabuf(VerbsDevice& dev, const BufferOwner& o, int access) {
  uint64_t offset = 0;
  const int fd = regDmabufMr() ? o.exportDmabuf(o.base, o.len, o.deviceIndex, &offset) : -1;
  ibv_mr* mr = fd >= 0 ? regDmabufMr()(dev.pd(), offset, o.len, reinterpret_cast<uint64_t>(o.base), fd, access) : nullptr;
  const int e = errno;
  if (fd >= 0) ::close(fd);  // the MR holds the dma-buf now
  if (!mr && !warnedDmabufFailure_) {
    warnedDmabufFailure_ = true;
    ROCE_WARN("rank ", rank_, ": registering device memory on ", dev.describe(), " by dma-buf failed (",
              fd < 0 ? std::string("the driver exported none") : std::string(std::strerror(e)),
              "); registering it by pointer (peer memory) instead");
  }
  return mr;
}

void RegCache::release(Entry* e) {
  if (e && e->inUse > 0) e->inUse--;
}

}  // namespace roce::transport::verbs
