// PrivateUse1 hooks: what torch.accelerator, pinned memory and
// UntypedStorage.resize_ ask of an out-of-tree device.

#include "testdev.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace testdev {
namespace {

// The device's DeviceGuardImpl (device.cpp), which keeps the current device.
const c10::impl::DeviceGuardImplInterface& guard() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }

  bool isAvailable() const override {
    return true;
  }

  bool hasPrimaryContext(c10::DeviceIndex /*device*/) const override {
    return true;
  }

  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    guard().setDevice({c10::DeviceType::PrivateUse1, device});
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::Device to{c10::DeviceType::PrivateUse1, device};
    return guard().exchangeDevice(to).index();
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return at::getHostAllocator(at::kPrivateUse1);
  }

  bool isPinnedPtr(const void* data) const override {
    return is_pinned(data);
  }

  // Device memory is not tagged with its device; the current one is the
  // best answer for from_blob callers that did not name one.
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {c10::DeviceType::PrivateUse1, current_device()};
  }

  // UntypedStorage.resize_ (FSDP frees and regrows parameters this way):
  // the old bytes are copied on the host, so queued kernels must finish.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize)
      const override {
    current_queue(storage.device().index()).synchronize();
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

[[maybe_unused]] const bool registered = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks);
  return true;
}();

} // namespace
} // namespace testdev
