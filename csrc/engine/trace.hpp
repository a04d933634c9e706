// The group's flight recorder: every collective and point-to-point operation
// in a fixed ring of plain entries. Recording must cost far less
// than the operation it records (an 8-byte allreduce takes a few
// microseconds), so an entry is written in place: no allocation, no string,
// no system call (the clock is the vDSO's CLOCK_MONOTONIC). One mutex per
// group guards the ring; the issuing thread writes an entry's first half and
// the progress thread (or the caller, for inline operations) its times and
// state, one after the other, so the mutex is uncontended except while a
// reader copies the ring out. Failure reasons are the one string: they are
// only written when an operation fails.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace roce::engine {

enum class TraceState : uint8_t { Scheduled, Started, Completed, Failed };
const char* traceStateName(TraceState s);

struct TraceEntry {
  uint64_t pos = 0;             // 1-based position in the ring's history (0: slot never written)
  uint64_t seq = 0;             // the group's operation number ("allreduce #12")
  uint64_t collectiveSeq = 0;   // collectives issued so far, this one included (p2p: the last collective's)
  uint64_t p2pSeq = 0;          // point-to-point operations so far, likewise
  const char* op = nullptr;     // a string literal ("allreduce")
  const char* algo = nullptr;   // the algorithm chosen (a literal), null where none is chosen
  int64_t enqueueNs = 0;        // CLOCK_MONOTONIC ns: issued
  int64_t startNs = 0;          // began running (0: not yet)
  int64_t endNs = 0;            // completed or failed (0: not yet)
  int64_t timeoutMs = 0;
  uint64_t inElems = 0, outElems = 0;  // elements of the input / output buffers (all tensors of the call)
  uint64_t bytes = 0;           // the payload size the algorithms see (per rank)
  int32_t peer = -1;            // p2p peer or root; -1: none (or any source before the message came)
  int32_t tag = 0;              // p2p tag
  int16_t inDtype = -1, outDtype = -1;  // the adapter's dtype codes (c10::ScalarType); -1: no tensor
  uint8_t opType = 0;           // the adapter's operation code (c10d::OpType)
  TraceState state = TraceState::Scheduled;
  bool p2p = false;
  bool inlined = false;         // ran on the caller's thread
};

class TraceRing {
 public:
  // capacity 0 turns recording off: record() returns 0 and the rest ignore it.
  explicit TraceRing(size_t capacity);
  bool enabled() const { return !slots_.empty(); }
  size_t capacity() const { return slots_.size(); }

  // Stores e (its pos, state and times are filled in here) and returns its
  // position, which the other calls take (0 when off).
  uint64_t record(const TraceEntry& e);
  void started(uint64_t pos, int64_t ns, bool inlined);
  // A null reason completes the entry; otherwise it failed with that reason.
  void finished(uint64_t pos, int64_t ns, const char* algo, const std::string* reason);
  // The entries still in the ring, oldest first, and their failure reasons.
  std::vector<TraceEntry> snapshot(std::vector<std::string>* reasons = nullptr) const;

  static int64_t nowNs();

 private:
  // The slot of pos, if the ring has not overwritten it since (mu_ held).
  TraceEntry* slot(uint64_t pos);

  mutable std::mutex mu_;
  std::vector<TraceEntry> slots_;
  std::vector<std::string> reasons_;  // parallel to slots_; empty unless failed
  uint64_t next_ = 0;                 // entries recorded so far
};

}  // namespace roce::engine
