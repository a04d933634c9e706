// The device every device step of roce's threads runs on.
//
// CUDA (and ROCm) keep a current device per thread, and a thread that never
// selected one works on device 0: an event recorded, queried or destroyed
// there, or a guard that restores "device 0" afterwards, makes the process
// create a context on GPU 0 (about 0.5 GiB on every rank of an 8-GPU host,
// an error in EXCLUSIVE_PROCESS mode). So each step a progress thread runs
// for a device call (copies, event queries, device reductions, completing the
// Work's future) runs under this guard, and a progress thread keeps the
// device of its first device step selected for good: what it does outside a
// step (an event destroyed with its task) acts on that device too.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include <optional>

namespace roce::adapter {

class DeviceStepGuard {
 public:
  // No device, or the CPU: does nothing.
  explicit DeviceStepGuard(std::optional<c10::Device> device);

 private:
  c10::OptionalDeviceGuard guard_;
};

}  // namespace roce::adapter
