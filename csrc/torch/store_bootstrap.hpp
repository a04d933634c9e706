// roce::Bootstrap over the c10d::Store torch hands the backend (already
// prefixed per group and device).
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "../common/bootstrap.hpp"

namespace roce {

class StoreBootstrap : public Bootstrap {
 public:
  explicit StoreBootstrap(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::optional<std::string> tryGet(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  std::unique_ptr<Bootstrap> clone() override {
    // A separate connection for the progress thread; stores that cannot clone
    // (HashStore, some FileStores) are shared instead, which is safe as their
    // operations lock internally.
    try {
      return std::make_unique<StoreBootstrap>(store_->clone());
    } catch (const std::exception&) {
      return std::make_unique<StoreBootstrap>(store_);
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace roce
