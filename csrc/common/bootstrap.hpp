// The key-value rendezvous the library uses at init (implemented by the torch
// adapter over the c10d::Store handed to the backend, already prefixed per group).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace roce {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Returns the value if the key exists, without blocking.
  virtual std::optional<std::string> tryGet(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // An independent connection usable from another thread.
  virtual std::unique_ptr<Bootstrap> clone() = 0;
};

// Waits until every key exists and returns the values in order. On timeout the
// error lists what is missing, using describeMissing(i) for key i
// (e.g. "rank 3 (never joined: check that it started)").
std::vector<std::string> waitForKeys(Bootstrap& bs, const std::vector<std::string>& keys,
                                     std::chrono::milliseconds timeout, const std::string& what,
                                     const std::function<std::string(size_t)>& describeMissing);

// Store-based barrier of `n` participants under `key` (each calls it once).
void storeBarrier(Bootstrap& bs, const std::string& key, int n, std::chrono::milliseconds timeout,
                  const std::string& what);

}  // namespace roce
