// The head of a window's shared memory: one per rank and window, in front of
// the bytes the window exposes. Peers on the same machine map it and write
// into it directly; the owner's progress thread writes into it for peers it
// serves over the network (window_service.hpp). Either way the owner reads
// signals from the same counters, so wait_signal does not care where a
// signal came from.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "../common/futex.hpp"

namespace roce::window {

// Signals from one peer: the count only grows (wrapping at 2^32); a waiter
// holds a ticket, the count that satisfies it, and compares by the signed
// difference, so wrapping never loses or invents a signal.
struct alignas(64) SignalCount {
  std::atomic<uint32_t> arrived{0};
};

struct alignas(64) WindowBoard {
  static constexpr uint64_t kMagic = 0x726f63652d77696eull;  // "roce-win"
  uint64_t magic = kMagic;
  // The data after the head is the registered tensor's whole storage (its
  // views keep working); the window is the tensor's part of it.
  uint64_t windowStart = 0;  // bytes from the data's start to the window
  uint64_t windowBytes = 0;
  uint32_t ranks = 0;        // counts that follow, one per group rank
  ShmWakeup bell;          // a waiter for any signal sleeps here

  // Bytes from the start of the segment to the window's data: the board and
  // its counts, rounded to a page so the data keeps the tensor's alignment.
  static size_t headBytes(int ranks) {
    const size_t raw = sizeof(WindowBoard) + static_cast<size_t>(ranks) * sizeof(SignalCount);
    return (raw + 4095) / 4096 * 4096;
  }
  // Builds the board in fresh (zeroed) memory.
  static WindowBoard* init(void* at, int ranks, uint64_t windowStart, uint64_t windowBytes) {
    auto* b = new (at) WindowBoard;
    b->ranks = static_cast<uint32_t>(ranks);
    b->windowStart = windowStart;
    b->windowBytes = windowBytes;
    for (int r = 0; r < ranks; ++r) new (&b->counts()[r]) SignalCount;
    return b;
  }
  SignalCount* counts() { return reinterpret_cast<SignalCount*>(this + 1); }
  char* data() { return reinterpret_cast<char*>(this) + headBytes(static_cast<int>(ranks)); }
  char* window() { return data() + windowStart; }

  // A peer's signal: after everything it wrote before (release), then wakes
  // the owner if it sleeps.
  void signalFrom(int rank) {
    counts()[rank].arrived.fetch_add(1, std::memory_order_seq_cst);
    bell.notify();
  }
  // Whether `rank`'s count reached `ticket` (acquire: the writes before that
  // signal are visible once this returns true).
  bool reached(int rank, uint32_t ticket) {
    return static_cast<int32_t>(counts()[rank].arrived.load(std::memory_order_seq_cst) - ticket) >= 0;
  }
};

}  // namespace roce::window
