// roce::Bootstrap over the c10d::Store torch hands the backend (already
// prefixed per group and device). Used only on the thread that creates the
// group, while it forms: no clone, no second connection to the store.
#pragma once
#include <atomic>
#include <cstdint>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "../common/bootstrap.hpp"
#include "../common/error.hpp"

namespace roce::adapter {

class StoreBootstrap : public Bootstrap {
 public:
  // `cancelled` (if given): set from another thread to end the formation's
  // waits, which then throw naming `why`.
  explicit StoreBootstrap(c10::intrusive_ptr<c10d::Store> store, const std::atomic<bool>* cancelled = nullptr,
                          std::string why = {})
      : store_(std::move(store)), cancelled_(cancelled), why_(std::move(why)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    // c10d stores report a wait that outlived its timeout by throwing
    // DistStoreError (a subclass of DistError); any other error is real.
    try {
      store_->wait(keys, timeout);
      return true;
    } catch (const c10::DistStoreError&) {
      return false;
    }
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    std::vector<std::string> out;
    for (auto& v : store_->multiGet(keys)) out.emplace_back(v.begin(), v.end());
    return out;
  }
  bool check(const std::string& key) override { return store_->check({key}); }
  void checkCancelled() override {
    if (cancelled_ && cancelled_->load()) throw Error(ErrorKind::Aborted, why_);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  const std::atomic<bool>* cancelled_;
  std::string why_;
};

}  // namespace roce::adapter
