// What this rank last did in a group, readable from any thread: the latest
// collective it issued, started and ended (completed or failed), by the group's
// collective sequence number (#1, #2, ... as the trace numbers them). The
// lifelines send a snapshot to every rank when an operation times out, so
// that each rank's error can name who is behind (verdict.hpp). Relaxed
// atomics: a snapshot taken while a call is issued may see the new number
// with the old name, which a message can afford.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace roce::liveness {

class OpProgress {
 public:
  // Caller's thread, when the collective is issued.
  void issued(uint64_t seq, const char* op) {
    issuedOp_.store(op, std::memory_order_relaxed);
    issuedAtMs_.store(nowMs(), std::memory_order_relaxed);
    issuedSeq_.store(seq, std::memory_order_relaxed);
  }
  // The thread that runs it, as it begins (collectives run in issue order).
  void started(uint64_t seq, const char* op) {
    startedOp_.store(op, std::memory_order_relaxed);
    startedSeq_.store(seq, std::memory_order_relaxed);
  }
  // Whichever thread ran it, once it completed or failed.
  void ended(uint64_t seq, const char* op) {
    endedOp_.store(op, std::memory_order_relaxed);
    uint64_t prev = endedSeq_.load(std::memory_order_relaxed);
    while (prev < seq && !endedSeq_.compare_exchange_weak(prev, seq, std::memory_order_relaxed)) {
    }
  }
  // "issued=4 issued_op=allreduce started=4 started_op=allreduce ended=3
  // ended_op=allreduce idle_ms=10012"
  // (idle_ms: since the latest issue, or since the group formed).
  std::string snapshot() const {
    auto name = [](const char* s) { return std::string(s ? s : "-"); };
    return "issued=" + std::to_string(issuedSeq_.load(std::memory_order_relaxed)) +
           " issued_op=" + name(issuedOp_.load(std::memory_order_relaxed)) +
           " started=" + std::to_string(startedSeq_.load(std::memory_order_relaxed)) +
           " started_op=" + name(startedOp_.load(std::memory_order_relaxed)) +
           " ended=" + std::to_string(endedSeq_.load(std::memory_order_relaxed)) +
           " ended_op=" + name(endedOp_.load(std::memory_order_relaxed)) +
           " idle_ms=" + std::to_string(nowMs() - issuedAtMs_.load(std::memory_order_relaxed));
  }

 private:
  static int64_t nowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::atomic<uint64_t> issuedSeq_{0}, startedSeq_{0}, endedSeq_{0};
  std::atomic<const char*> issuedOp_{nullptr}, startedOp_{nullptr}, endedOp_{nullptr};  // string literals
  std::atomic<int64_t> issuedAtMs_{nowMs()};
};

}  // namespace roce::liveness
