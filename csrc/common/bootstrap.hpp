// The key-value rendezvous a group forms through (implemented by the torch
// adapter over the c10d::Store handed to the backend, already prefixed per
// group, and by tests/scale's own store for the torch-free harness).
//
// Only the thread that creates a group uses it, and only while the group
// forms: a store call can block for the store's whole timeout when its host is
// unreachable, so nothing after init depends on the store.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace roce {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True once every key exists, false if `timeout` passed first. The store
  // blocks (one round trip), so waiting costs no polling traffic.
  virtual bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Values of keys that exist (wait() said so), in one round trip where the store can.
  virtual std::vector<std::string> multiGet(const std::vector<std::string>& keys) = 0;
  // Whether `key` exists; for naming what is missing when a wait times out.
  virtual bool check(const std::string& key) = 0;
  // Throws when whoever forms the group gave up on it (an abort while a
  // membership forms); the formation's waits call it once per slice. A
  // wrapper forwards it to what it wraps.
  virtual void checkCancelled() = 0;
};

// Every key of `inner` under `prefix` (a group incarnation's namespace).
class ScopedBootstrap : public Bootstrap {
 public:
  ScopedBootstrap(Bootstrap& inner, std::string prefix) : inner_(inner), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::string& value) override { inner_.set(prefix_ + key, value); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_.add(prefix_ + key, delta); }
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    return inner_.wait(scoped(keys), timeout);
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    return inner_.multiGet(scoped(keys));
  }
  bool check(const std::string& key) override { return inner_.check(prefix_ + key); }
  void checkCancelled() override { inner_.checkCancelled(); }
  const std::string& prefix() const { return prefix_; }

 private:
  std::vector<std::string> scoped(const std::vector<std::string>& keys) const;
  Bootstrap& inner_;
  std::string prefix_;
};

// Waits until every key exists and returns the values in order. Waits in
// slices of about a second; after each slice without success `probe` (if
// given) may throw to end the wait early (a peer known to be gone). On the
// deadline the error lists what is missing, using describeMissing(i) for key
// i (e.g. "rank 3 (it has not joined the group)").
std::vector<std::string> waitForKeys(Bootstrap& bs, const std::vector<std::string>& keys,
                                     std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout,
                                     const std::string& what,
                                     const std::function<std::string(size_t)>& describeMissing,
                                     const std::function<void()>& probe = nullptr);

// Store-based barrier of `n` participants under `key` (each calls it once).
void storeBarrier(Bootstrap& bs, const std::string& key, int n, std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds timeout, const std::string& what,
                  const std::function<void()>& probe = nullptr);

}  // namespace roce
