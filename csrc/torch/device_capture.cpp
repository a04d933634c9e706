#include "device_capture.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include "cuda_driver.hpp"

namespace roce::adapter {

bool streamCapturing(const c10::Stream& stream) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
  // Every device type through c10's interface (ROCm's tensors say CUDA but
  // have no libcuda); one that does not implement it has no capture to be in.
  try {
    if (c10::impl::VirtualGuardImpl(stream.device_type()).isStreamCapturing(stream)) return true;
  } catch (const c10::Error&) {
  }
#endif
  // CUDA also through the driver, which answers for any torch roce builds against.
  return stream.device_type() == c10::DeviceType::CUDA && cudaStreamCapturing(stream.native_handle());
}

void refuseCapture(c10::Device device, int rank, const char* what) {
  const c10::Stream stream = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  TORCH_CHECK(!streamCapturing(stream), "roce: rank ", rank, ": ", what, " on ", device.str(),
              " while the current stream (", device.str(), " stream ", stream.id(),
              ") is capturing a graph. roce moves device tensors through host memory on its own threads, which "
              "a graph cannot replay: issue the collective and wait for it outside the capture (e.g. before or "
              "after torch.cuda.graph(...)), or capture only the compute. Nothing was queued; the group stays "
              "usable.");
}

}  // namespace roce::adapter
