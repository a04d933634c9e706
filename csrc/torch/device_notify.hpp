// Waking the progress thread when device work completes. Device events give
// no descriptor to block on; polling one means either a busy core (ranks may
// outnumber cores) or naps that add up to their length to every wait. Where
// the device can run a host function in stream order (CUDA: cuLaunchHostFunc;
// a PrivateUse1 backend that declares one), a wait that would block arms a
// notice instead: a stream of the group's own waits for the event, then runs
// a host function that sets a flag and writes an eventfd the progress thread
// sleeps on. The host function sits on that otherwise idle stream, not on
// the copy streams, so the copies never stall behind it.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <chrono>
#include <memory>

namespace roce {

// Queues fn(data) on `stream`, to run on a host thread once the work queued
// there before it has run; false if it could not be queued. fn must not call
// the device's API (CUDA forbids it in host functions).
using LaunchHostFunc = bool (*)(const c10::Stream& stream, void (*fn)(void*), void* data);

// Declares the host functions of `type` (a PrivateUse1 backend, tests), or
// withdraws them (null): its waits then poll.
void declareHostFunc(c10::DeviceType type, LaunchHostFunc launch);
// The declared one; for CUDA, the driver's where it loads; else null.
LaunchHostFunc hostFuncOf(c10::DeviceType type);

// One wait's wake-up, shared by the waiter and the host function in flight
// (which may run after the waiter gave up: a timeout, an abort).
class DeviceNotice {
 public:
  // `stream` waits for `event`, then a host function fires the notice. Null
  // when the device type has no host functions or queuing failed (the
  // caller then polls).
  static std::shared_ptr<DeviceNotice> arm(const c10::Event& event, const c10::Stream& stream);
  ~DeviceNotice();
  DeviceNotice(const DeviceNotice&) = delete;
  DeviceNotice& operator=(const DeviceNotice&) = delete;

  bool fired() const { return fired_.load(std::memory_order_acquire); }
  // Sleeps until the notice fires or `limit` passes.
  void block(std::chrono::milliseconds limit) const;

 private:
  DeviceNotice() = default;
  static void onDevice(void* data);
  std::atomic<bool> fired_{false};
  int fd_ = -1;  // eventfd
};

}  // namespace roce
