// Waking the progress thread when device work completes. Device events give
// no descriptor to block on; polling one means either a busy core (ranks may
// outnumber cores) or naps that add up to their length to every wait. Where
// the device can run a host function in stream order (CUDA: cuLaunchHostFunc;
// a PrivateUse1 backend that declares one), a wait that would block arms a
// notice instead: a stream that carries nothing else waits for the event,
// then runs a host function that sets a flag and writes an eventfd the
// progress thread sleeps on. On CUDA that stream is roce's own, created
// through the driver (torch's pool streams are shared with the user's
// streams, whose kernels would delay the notice); elsewhere the group's
// `notify` stream. Never a copy stream: the copies must not stall behind
// the host function's round trip.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <memory>

namespace roce::adapter {

// Queues fn(data) on `stream`, to run on a host thread once the work queued
// there before it has run; false if it could not be queued. fn must not call
// the device's API (CUDA forbids it in host functions).
using LaunchHostFunc = bool (*)(const c10::Stream& stream, void (*fn)(void*), void* data);

// Declares the host functions of `type` (a PrivateUse1 backend, tests), or
// withdraws them (null): its waits then poll.
void declareHostFunc(c10::DeviceType type, LaunchHostFunc launch);

// One wait's wake-up, shared by the waiter and the host function in flight
// (which may run after the waiter gave up: a timeout, an abort).
class DeviceNotice {
 public:
  // A host function fires the notice once `event` has completed: on CUDA
  // from roce's own stream (the driver's), elsewhere from `stream`, which
  // waits for the event first. Null when the device type has no host
  // functions, `stream` is capturing a graph (a pool stream a user's capture
  // took: waiting there would join and break it), or queuing failed: the
  // caller then polls.
  static std::shared_ptr<DeviceNotice> arm(const c10::Event& event, const c10::Stream& stream);
  ~DeviceNotice();
  DeviceNotice(const DeviceNotice&) = delete;
  DeviceNotice& operator=(const DeviceNotice&) = delete;

  bool fired() const { return fired_.load(std::memory_order_acquire); }
  // An eventfd that turns readable when the notice fires and stays so
  // (Communicator::WakeOnFd).
  int fd() const { return fd_; }

 private:
  DeviceNotice() = default;
  static void onDevice(void* data);
  std::atomic<bool> fired_{false};
  int fd_ = -1;  // eventfd
};

}  // namespace roce::adapter
