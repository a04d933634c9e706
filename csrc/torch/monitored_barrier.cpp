#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "monitored_barrier.hpp"

#include <c10/util/Exception.h>
#include <cstdint>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "../common/error.hpp"

namespace roce::adapter {
namespace {

using Clock = std::chrono::steady_clock;

// The group's store is shared with the connection bootstrap ("info/<rank>",
// "roce_abort"): one prefix keeps the barrier's keys apart from those.
std::string keyOf(uint64_t sequence, const std::string& what) {
  return str("roce_monitored_barrier/", sequence, "/", what);
}

const char* const kReleased = "ok";

// Polls with check() rather than Store::wait(): a zero timeout means "wait
// forever" to TCPStore and FileStore, FileStore rounds a wait up to whole
// seconds, and stores raise different exceptions when a wait times out. The
// pause grows to 10 ms, which bounds how late a timeout is noticed.
bool arrivesBy(c10d::Store& store, const std::string& key, Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    if (store.check({key})) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

// Keys are removed once nobody can still read them; a store that cannot
// delete keys (some Python stores) only keeps a few bytes per call.
void forget(c10d::Store& store, const std::string& key) {
  try {
    store.deleteKey(key);
  } catch (const std::exception&) {
  }
}

std::string joined(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// Rank 0: waits for every other rank's arrival, then releases them. Returns
// the failure to report ("" when every rank arrived).
std::string lead(c10d::Store& store, const MonitoredBarrierCall& call) {
  const auto deadline = Clock::now() + call.timeout;
  const auto ms = call.timeout.count();
  const char* const why =
      "it did not call monitored_barrier in time (slow, stuck in other work, crashed, or skipped this call); "
      "its own log or a stack dump of it (py-spy dump) tells which";
  std::vector<int> missing;
  std::string failure;
  for (int r = 1; r < call.size; ++r) {
    const std::string arrived = keyOf(call.sequence, str("arrived/", r));
    const bool hadTime = Clock::now() < deadline;
    if (arrivesBy(store, arrived, deadline)) {
      forget(store, arrived);
      continue;
    }
    missing.push_back(r);
    if (call.waitAllRanks) continue;  // the deadline has passed: the rest are only checked
    // The wording "Rank N failed to pass monitoredBarrier" / "Rank 0 timed out
    // in monitoredBarrier" is what torch's tests and users' scripts match.
    failure = hadTime ? str("Rank ", r, " failed to pass monitoredBarrier in ", ms, " ms: ", why)
                      : str("Rank 0 timed out in monitoredBarrier after ", ms, " ms, before rank ", r,
                            " had arrived (ranks after it were not checked); give the barrier a longer timeout");
    break;
  }
  // "Ranks" even for one rank: it is the form torch's wait_all_ranks tests match.
  if (call.waitAllRanks && !missing.empty())
    failure = str("Ranks ", joined(missing), " failed to pass monitoredBarrier in ", ms, " ms: ",
                  missing.size() == 1 ? "it" : "each", " did not call monitored_barrier in time");
  const std::string release = failure.empty() ? kReleased : failure;
  store.set(keyOf(call.sequence, "release"), std::vector<uint8_t>(release.begin(), release.end()));
  // Every rank arrived at this call, so all of them have read the previous
  // call's release. A failed release stays: a late rank may still read it.
  if (failure.empty() && call.sequence > 1) forget(store, keyOf(call.sequence - 1, "release"));
  return failure;
}

// Ranks other than 0: arrive, then wait for rank 0's verdict. Returns the
// failure to report ("" when released).
std::string follow(c10d::Store& store, const MonitoredBarrierCall& call) {
  const std::string arrived = "1";
  store.set(keyOf(call.sequence, str("arrived/", call.rank)), std::vector<uint8_t>(arrived.begin(), arrived.end()));
  const std::string release = keyOf(call.sequence, "release");
  // The wording up to "from rank 0" is the one torch's tests match.
  const std::string head = str("Rank ", call.rank,
                               " successfully reached monitoredBarrier, but received errors while waiting for "
                               "send/recv from rank 0 (its release, sent through the store): ");
  std::string verdict;
  try {
    // A zero wait means "forever" to some stores.
    store.wait({release}, std::max(call.releaseWait, std::chrono::milliseconds(1)));
    const auto v = store.get(release);
    verdict.assign(v.begin(), v.end());
  } catch (const std::exception& e) {
    return str(head, "no release within ", call.releaseWait.count(),
               " ms; rank 0 has not finished this barrier (is it still in earlier work?), see its log. The store said: ",
               e.what());
  }
  if (verdict == kReleased) return "";
  return str(head, "rank 0 reports: ", verdict);
}

}  // namespace

void monitoredBarrier(c10d::Store& store, const MonitoredBarrierCall& call) {
  const std::string failure = call.rank == 0 ? lead(store, call) : follow(store, call);
  if (!failure.empty())
    C10_THROW_ERROR(DistBackendError, str("roce: monitored_barrier #", call.sequence, " (group of ", call.size,
                                          ", rank ", call.rank, "): ", failure));
}

}  // namespace roce::adapter
