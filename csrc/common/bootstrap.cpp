#include "bootstrap.hpp"

#include <thread>

#include "backoff.hpp"
#include "error.hpp"

namespace roce {

std::vector<std::string> waitForKeys(Bootstrap& bs, const std::vector<std::string>& keys,
                                     std::chrono::milliseconds timeout, const std::string& what,
                                     const std::function<std::string(size_t)>& describeMissing) {
  std::vector<std::optional<std::string>> got(keys.size());
  const auto deadline = Clock::now() + timeout;
  auto sleep = std::chrono::milliseconds(1);
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!got[i]) got[i] = bs.tryGet(keys[i]);
      all &= got[i].has_value();
    }
    if (all) break;
    if (Clock::now() >= deadline) {
      std::string missing;
      for (size_t i = 0; i < keys.size(); ++i)
        if (!got[i]) missing += (missing.empty() ? "" : ", ") + describeMissing(i);
      throwTimeout(str(what, " timed out after ", timeout.count(), " ms; still waiting for ",
                       missing, ". Check that every rank started and reached the same call, "
                       "or raise the timeout of init_process_group/new_group"));
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (auto& v : got) out.push_back(std::move(*v));
  return out;
}

void storeBarrier(Bootstrap& bs, const std::string& key, int n, std::chrono::milliseconds timeout,
                  const std::string& what) {
  int64_t arrived = bs.add(key, 1);
  if (arrived == n) bs.set(key + "/done", "1");
  waitForKeys(bs, {key + "/done"}, timeout, what, [&](size_t) {
    return str(n - bs.add(key, 0), " of ", n, " ranks");
  });
}

}  // namespace roce
