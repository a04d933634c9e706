#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "device_notify.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include "cuda_driver.hpp"
#include "device_capture.hpp"
#include "device_declarations.hpp"

namespace roce::adapter {
namespace {

DeviceDeclarations<LaunchHostFunc>& declared() {
  static DeviceDeclarations<LaunchHostFunc> d;
  return d;
}

LaunchHostFunc declaredFor(c10::DeviceType type) { return declared().find(type).value_or(nullptr); }

}  // namespace

void declareHostFunc(c10::DeviceType type, LaunchHostFunc launch) {
  if (launch) declared().set(type, launch);
  else declared().erase(type);
}

std::shared_ptr<DeviceNotice> DeviceNotice::arm(const c10::Event& event, const c10::Stream& stream) {
  const LaunchHostFunc declared = declaredFor(stream.device_type());
  const bool cuda = !declared && stream.device_type() == c10::DeviceType::CUDA && cudaHostFnSupported();
  if (!declared && !cuda) return nullptr;
  if (declared && streamCapturing(stream)) return nullptr;
  std::shared_ptr<DeviceNotice> notice(new DeviceNotice());
  notice->fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (notice->fd_ < 0) return nullptr;
  // The host function owns a reference until it ran: the waiter may be gone by then.
  auto* held = new std::shared_ptr<DeviceNotice>(notice);
  try {
    bool queued = false;
    if (cuda) {
      queued = cudaHostFnAfterEvent(event.eventId(), event.device_index(), &DeviceNotice::onDevice, held);
    } else {
      event.block(stream);
      queued = declared(stream, &DeviceNotice::onDevice, held);
    }
    if (queued) return notice;
  } catch (const std::exception&) {
    // A device error here shows again where the caller polls the event.
  }
  delete held;
  return nullptr;
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

}  // namespace roce::adapter
