#pragma once
// Declarations shared by the test device's sources. What the device models
// (and what it does not) is described in __init__.py.

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace testdev {

// "testdev:1 stream 3". Streams and devices are named through str(), not
// c10's operator<<: that crashed on the GPU machines (torch 2.11) when given
// an ostream made in this extension, which had its own libstdc++ copy.
inline std::string describe(const c10::Stream& stream) {
  return stream.device().str() + " stream " + std::to_string(stream.id());
}

class Queue;

// A graph capture, as CUDA's stream capture behaves where it catches
// backends: it starts on one stream (the origin); work queued on a capturing
// stream is recorded, not run; an event recorded there belongs to the
// capture, and a stream made to wait for such an event joins the capture
// (work a backend queues there later is captured too); querying or
// synchronizing a capturing stream or a captured event fails and invalidates
// the capture; ending it fails if it was invalidated or if a stream that
// joined was never joined back into the origin (an event of its recorded and
// waited for on the origin).
struct Capture {
  std::mutex mutex; // guards the fields below but tasks_recorded
  Queue* origin = nullptr;
  bool active = true;
  std::string invalidated; // why, or empty
  std::set<Queue*> joined;
  std::set<Queue*> rejoined;
  std::atomic<int64_t> tasks_recorded{0};
};

// One stream: a FIFO of host functions that a worker thread of its own runs
// in order, so work on different streams overlaps like on a GPU. Tasks are
// numbered by tickets 1, 2, ...; reached(t) means task t and every task
// before it have finished. An event is just a (queue, ticket) pair.
class Queue {
 public:
  explicit Queue(c10::Stream stream) : stream_(stream) {}

  c10::Stream stream() const {
    return stream_;
  }

  // Returns the task's ticket. The worker thread starts with the first task,
  // so streams that are never used cost no thread. While the stream
  // captures, the task is recorded (counted) instead, and the ticket is the
  // last one queued before.
  uint64_t enqueue(std::function<void()> task);
  // The capture this stream takes part in, or null.
  std::shared_ptr<Capture> capture();
  void set_capture(std::shared_ptr<Capture> capture);
  // Fails (and invalidates the capture) if the stream captures: what
  // querying or synchronizing it does on CUDA.
  void refuse_if_capturing(const char* what);
  // Makes this stream stop, at this point of its order, until `other` has
  // reached `ticket` (cudaStreamWaitEvent).
  void enqueue_wait(Queue& other, uint64_t ticket);
  // The ticket of the latest task: reaching it means "idle as of now".
  uint64_t last_ticket();
  bool reached(uint64_t ticket) const;
  // Blocks the calling thread until `ticket` is reached.
  void wait(uint64_t ticket);
  // Waits for all work queued so far, then reports (once) the first error a
  // task raised since the last synchronize, the way CUDA reports a failed
  // kernel at the next synchronizing call.
  void synchronize();

 private:
  void run();

  const c10::Stream stream_;
  std::mutex mutex_;
  std::condition_variable work_added_;
  std::condition_variable work_done_;
  std::deque<std::function<void()>> tasks_;
  uint64_t enqueued_ = 0;
  std::atomic<uint64_t> completed_{0};
  bool worker_started_ = false;
  std::string error_;
  std::shared_ptr<Capture> capture_;
};

// Queues fn(data) on `stream`, run by its worker once the work queued before
// it has run: CUDA's cuLaunchHostFunc, for roce_pg.declare_device_host_func.
// False while the stream captures (as CUDA, it would be recorded, not run).
bool launch_host_func(const c10::Stream& stream, void (*fn)(void*), void* data);

// --- devices and streams (device.cpp)
c10::DeviceIndex device_count();
c10::DeviceIndex current_device();
Queue& queue_of(const c10::Stream& stream);
Queue& current_queue(c10::DeviceIndex device);
void synchronize_device(c10::DeviceIndex device);

// --- contexts (device.cpp)
// CUDA works on a thread's current device, and a thread that never selected
// one works on device 0: an event recorded, waited for, queried or destroyed
// from such a thread makes the process use device 0 (a context of ~0.5 GiB
// there, an error in exclusive-process mode). Counted per device: the device
// current on the calling thread at each such call.
std::vector<int64_t> device_touches();
void reset_device_touches();

// --- graph capture (device.cpp)
void capture_begin(const c10::Stream& stream);
// Ends the capture begun on `stream`; throws if it was invalidated or left a
// joined stream unjoined. Returns the number of tasks recorded.
int64_t capture_end(const c10::Stream& stream);
bool is_capturing(const c10::Stream& stream);

// --- memory (allocators.cpp)
// recordStream: `stream` uses the device memory behind `data`, so the block
// is not reused before the work `stream` has queued at free time finished.
void record_stream(const c10::DataPtr& data, const c10::Stream& stream);
// True for memory handed out by the host ("pinned") allocator.
bool is_pinned(const void* ptr);
std::map<std::string, int64_t> device_counters();
std::map<std::string, int64_t> host_counters();
void reset_counters();
// Synchronizes every device first: queued tasks may still touch cached blocks.
void empty_cache();
// The id of the device block holding `ptr` (block_cache.h), 0 if none: the
// device's CU_POINTER_ATTRIBUTE_BUFFER_ID, for roce_pg.declare_device_memory.
uint64_t device_buffer_id(const void* ptr, int device);

// --- kernels (kernels.cpp)
// A CPU tensor over the same host memory and geometry as the device tensor
// `t`: what a kernel "running on the device" reads and writes.
at::Tensor cpu_alias(const at::Tensor& t);
// Extra time every host<->device copy spends on its stream before copying.
void set_copy_delay_ms(double ms);
// Host<->device copies running at this moment, and the most that ever ran at
// once since the last reset: more than one means copies on different streams
// overlapped (a state tests can assert instead of a duration).
std::map<std::string, int64_t> copy_concurrency();
void reset_copy_concurrency();

} // namespace testdev
