#include "bootstrap.hpp"

#include <algorithm>
#include <cstdint>

#include "backoff.hpp"
#include "error.hpp"

namespace roce {
namespace {
// How long one wait blocks in the store before the probe runs. Formation
// normally takes well under a second, so this only matters when a rank is
// missing: long enough that c10d's TCPStore (which logs a warning for every
// wait that times out) stays quiet, short enough that a peer known to be gone
// ends the wait long before the group timeout.
constexpr auto kSlice = std::chrono::milliseconds(10000);
}  // namespace

std::vector<std::string> ScopedBootstrap::scoped(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}

std::vector<std::string> waitForKeys(Bootstrap& bs, const std::vector<std::string>& keys,
                                     std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
                                     const std::string& what,
                                     const std::function<std::string(size_t)>& describeMissing,
                                     const std::function<void()>& probe) {
  for (;;) {
    bs.checkCancelled();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (bs.wait(keys, std::clamp(left, std::chrono::milliseconds(1), kSlice))) break;
    if (Clock::now() >= deadline) {
      std::string missing;
      for (size_t i = 0; i < keys.size(); ++i)
        if (!bs.check(keys[i])) {
          missing += (missing.empty() ? "" : ", ") + describeMissing(i);
          if (missing.size() > 2000) { missing += ", ..."; break; }  // 1,000 ranks that never came
        }
      throwTimeout(str(what, " timed out after ", timeout.count(), " ms; still waiting for ",
                       missing.empty() ? std::string("keys that appeared just now") : missing,
                       ". Check that every rank started and reached the same call, "
                       "or raise the timeout of init_process_group/new_group"));
    }
    if (probe) probe();
  }
  return bs.multiGet(keys);
}

void storeBarrier(Bootstrap& bs, const std::string& key, int n, std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds timeout, const std::string& what, const std::function<void()>& probe) {
  const int64_t arrived = bs.add(key, 1);
  if (arrived == n) bs.set(key + "/done", "1");
  waitForKeys(bs, {key + "/done"}, deadline, timeout, what,
              [&](size_t) { return str(n - bs.add(key, 0), " of ", n, " ranks"); }, probe);
}

}  // namespace roce
