#include "trace.hpp"

#include <chrono>
#include <cstdint>

namespace roce::engine {

const char* traceStateName(TraceState s) {
  switch (s) {
    case TraceState::Scheduled: return "scheduled";
    case TraceState::Started: return "started";
    case TraceState::Completed: return "completed";
    case TraceState::Failed: return "failed";
  }
  return "unknown";
}

TraceRing::TraceRing(size_t capacity) : slots_(capacity), reasons_(capacity) {}

int64_t TraceRing::nowNs() {
  // steady_clock is CLOCK_MONOTONIC, read through the vDSO (no system call),
  // and the clock of the engine's deadlines, whose reading it reuses.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t TraceRing::record(const TraceEntry& e) {
  if (slots_.empty()) return 0;
  const int64_t now = nowNs();
  std::lock_guard<std::mutex> g(mu_);
  const uint64_t pos = ++next_;
  const size_t i = (pos - 1) % slots_.size();
  TraceEntry& s = slots_[i];
  s = e;
  s.pos = pos;
  s.state = TraceState::Scheduled;
  s.enqueueNs = now;
  s.startNs = s.endNs = 0;
  if (!reasons_[i].empty()) reasons_[i].clear();  // keeps its buffer: no allocation
  return pos;
}

TraceEntry* TraceRing::slot(uint64_t pos) {
  if (pos == 0 || pos + slots_.size() <= next_) return nullptr;  // off, or overwritten since
  return &slots_[(pos - 1) % slots_.size()];
}

void TraceRing::started(uint64_t pos, int64_t ns, bool inlined) {
  if (pos == 0) return;
  std::lock_guard<std::mutex> g(mu_);
  if (TraceEntry* s = slot(pos)) {
    s->startNs = ns;
    s->inlined = inlined;
    s->state = TraceState::Started;
  }
}

void TraceRing::finished(uint64_t pos, int64_t ns, const char* algo, const std::string* reason) {
  if (pos == 0) return;
  std::lock_guard<std::mutex> g(mu_);
  if (TraceEntry* s = slot(pos)) {
    s->endNs = ns;
    if (algo) s->algo = algo;
    s->state = reason ? TraceState::Failed : TraceState::Completed;
    if (reason) reasons_[(pos - 1) % slots_.size()] = *reason;
  }
}

std::vector<TraceEntry> TraceRing::snapshot(std::vector<std::string>* reasons) const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<TraceEntry> out;
  if (slots_.empty()) return out;
  const uint64_t first = next_ > slots_.size() ? next_ - slots_.size() + 1 : 1;
  out.reserve(next_ + 1 - first);
  for (uint64_t pos = first; pos <= next_; ++pos) {
    const size_t i = (pos - 1) % slots_.size();
    out.push_back(slots_[i]);
    if (reasons) reasons->push_back(reasons_[i]);
  }
  return out;
}

}  // namespace roce::engine
