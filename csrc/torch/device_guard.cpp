#include "device_guard.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>

#include "../engine/engine.hpp"
#include "cuda_driver.hpp"

namespace roce::adapter {
using namespace roce::engine;

DeviceStepGuard::DeviceStepGuard(std::optional<c10::Device> device) {
  if (!device || device->is_cpu()) return;
  // Only a thread roce owns keeps the device: a caller's thread that runs a
  // step (a task completed after the engine stopped, a staging destroyed when
  // its call failed at issue) gets its own device back.
  thread_local bool selected = false;
  if (!selected && Engine::onProgressThread()) {
    c10::impl::VirtualGuardImpl(device->type()).setDevice(*device);
    // Its event queries must not be refused, nor break the capture, while
    // the caller's thread captures a graph around compute alone.
    if (device->type() == c10::DeviceType::CUDA) cudaThreadLocalCaptureMode();
    selected = true;
  }
  guard_.reset_device(*device);
}

}  // namespace roce::adapter
