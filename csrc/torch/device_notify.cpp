#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "device_notify.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "cuda_driver.hpp"

namespace roce {
namespace {

std::mutex mu;
std::map<c10::DeviceType, LaunchHostFunc>& declared() {
  static std::map<c10::DeviceType, LaunchHostFunc> m;
  return m;
}

bool launchCuda(const c10::Stream& stream, void (*fn)(void*), void* data) {
  return cudaLaunchHostFn(reinterpret_cast<void*>(stream.native_handle()), stream.device_index(), fn, data);
}

}  // namespace

void declareHostFunc(c10::DeviceType type, LaunchHostFunc launch) {
  std::lock_guard<std::mutex> g(mu);
  if (launch) declared()[type] = launch;
  else declared().erase(type);
}

LaunchHostFunc hostFuncOf(c10::DeviceType type) {
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = declared().find(type);
    if (it != declared().end()) return it->second;
  }
  if (type == c10::DeviceType::CUDA && cudaHostFnSupported()) return launchCuda;
  return nullptr;
}

std::shared_ptr<DeviceNotice> DeviceNotice::arm(const c10::Event& event, const c10::Stream& stream) {
  const LaunchHostFunc launch = hostFuncOf(stream.device_type());
  if (!launch) return nullptr;
  std::shared_ptr<DeviceNotice> notice(new DeviceNotice());
  notice->fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (notice->fd_ < 0) return nullptr;
  event.block(stream);
  // The host function owns a reference until it ran: the waiter may be gone by then.
  auto* held = new std::shared_ptr<DeviceNotice>(notice);
  if (!launch(stream, &DeviceNotice::onDevice, held)) {
    delete held;
    return nullptr;
  }
  return notice;
}

void DeviceNotice::onDevice(void* data) {
  auto* held = static_cast<std::shared_ptr<DeviceNotice>*>(data);
  DeviceNotice& n = **held;
  n.fired_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  if (write(n.fd_, &one, sizeof(one)) < 0) { /* the counter is already non-zero: the waiter wakes anyway */ }
  delete held;
}

DeviceNotice::~DeviceNotice() {
  if (fd_ >= 0) close(fd_);
}

void DeviceNotice::block(std::chrono::milliseconds limit) const {
  if (fired()) return;
  pollfd p{fd_, POLLIN, 0};
  poll(&p, 1, static_cast<int>(limit.count()));
}

}  // namespace roce
