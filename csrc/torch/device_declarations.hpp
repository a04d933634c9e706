// What device types declared to roce from Python (roce_pg.declare_device_memory,
// declare_device_host_func): for PrivateUse1 backends and tests, which roce
// cannot detect. One small table per kind of declaration. Thread-safe.
#pragma once
#include <c10/core/DeviceType.h>

#include <map>
#include <mutex>
#include <optional>

namespace roce::adapter {

template <class T>
class DeviceDeclarations {
 public:
  void set(c10::DeviceType type, T value) {
    std::lock_guard<std::mutex> g(mu_);
    byType_[type] = std::move(value);
  }
  void erase(c10::DeviceType type) {
    std::lock_guard<std::mutex> g(mu_);
    byType_.erase(type);
  }
  std::optional<T> find(c10::DeviceType type) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = byType_.find(type);
    return it == byType_.end() ? std::nullopt : std::optional<T>(it->second);
  }

 private:
  mutable std::mutex mu_;
  std::map<c10::DeviceType, T> byType_;
};

}  // namespace roce::adapter
