// Refusing device calls issued while the caller's stream captures a graph.
//
// roce's device path runs the network part on the host: its copies are
// queued on side streams at issue and its progress thread queries their
// events. Inside a CUDA graph capture those side streams would join the
// capture (their work recorded, not run), the progress thread's queries would
// fail and invalidate the capture, and the group would be broken. So a call
// made while capturing fails at issue, before anything is queued, naming the
// fix; the group stays usable for calls made outside the capture.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace roce::adapter {

// Whether `stream` is capturing a graph (any device type c10 can ask; CUDA
// also through the driver).
bool streamCapturing(const c10::Stream& stream);

// Throws c10::Error if the current stream of `device` is capturing.
// `rank` and `what` ("a collective ... was issued") name the call in the message.
void refuseCapture(c10::Device device, int rank, const char* what);

}  // namespace roce::adapter
