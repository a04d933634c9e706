// Single-producer single-consumer byte ring in shared memory. The producer and
// consumer are different processes; head and tail live on separate cache lines
// and only ever grow (indices are taken modulo the power-of-two capacity).
#pragma once
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "../../common/error.hpp"
#include "shm_segment.hpp"

namespace roce::transport::shm {

struct alignas(64) ShmRingControl {
  std::atomic<uint64_t> head;  // bytes ever written (producer)
  char pad0[64 - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> tail;  // bytes ever read (consumer)
  char pad1[64 - sizeof(std::atomic<uint64_t>)];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");

class ShmRing {
 public:
  ShmRing() = default;
  ShmRing(ShmRingControl* ctl, char* data, size_t capacity) : ctl_(ctl), data_(data), cap_(capacity) {}

  // Allocates the data pages (the producer, before its first write): 0, or
  // the errno of the failure (/dev/shm is full).
  int allocate() { return ShmSegment::allocate(data_, cap_); }

  // `peer` names the other end in the error raised when the shared indices are
  // impossible (a peer scribbling over the segment): they are read once into
  // locals and checked before they steer a copy.
  size_t write(const iovec* iov, int iovcnt, int peer) {
    uint64_t head = ctl_->head.load(std::memory_order_relaxed);
    uint64_t tail = ctl_->tail.load(std::memory_order_acquire);
    if (head - tail > cap_) corrupted(peer, head, tail);
    size_t space = cap_ - static_cast<size_t>(head - tail);
    size_t total = 0;
    for (int i = 0; i < iovcnt && space > 0; ++i) {
      size_t n = std::min(space, iov[i].iov_len);
      copyIn(head + total, static_cast<const char*>(iov[i].iov_base), n);
      total += n;
      space -= n;
    }
    if (total) ctl_->head.store(head + total, std::memory_order_release);
    return total;
  }

  size_t read(void* dst, size_t n, int peer) {
    uint64_t tail = ctl_->tail.load(std::memory_order_relaxed);
    uint64_t head = ctl_->head.load(std::memory_order_acquire);
    if (head - tail > cap_) corrupted(peer, head, tail);
    size_t avail = static_cast<size_t>(head - tail);
    n = std::min(n, avail);
    if (!n) return 0;
    size_t pos = tail & (cap_ - 1);
    size_t first = std::min(n, cap_ - pos);
    std::memcpy(dst, data_ + pos, first);
    std::memcpy(static_cast<char*>(dst) + first, data_, n - first);
    ctl_->tail.store(tail + n, std::memory_order_release);
    return n;
  }

 private:
  [[noreturn]] static void corrupted(int peer, uint64_t head, uint64_t tail) {
    throwComm(str("the shared-memory ring with rank ", peer, " is corrupted (head ", head, ", tail ", tail,
                  "): that process wrote over shared memory it does not own"));
  }
  void copyIn(uint64_t at, const char* src, size_t n) {
    size_t pos = at & (cap_ - 1);
    size_t first = std::min(n, cap_ - pos);
    std::memcpy(data_ + pos, src, first);
    std::memcpy(data_, src + first, n - first);
  }

  ShmRingControl* ctl_ = nullptr;
  char* data_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace roce::transport::shm
