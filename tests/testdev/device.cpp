// Devices, streams and events: the stream registry, each thread's current
// device and streams, and the DeviceGuardImpl through which c10 drives them
// (torch.Stream, torch.Event, torch.accelerator, autograd, c10d backends).

#include "testdev.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

namespace testdev {
namespace {

constexpr c10::DeviceIndex kMaxDevices = 16;
// Like CUDA's per-device pool that getStreamFromGlobalPool hands out round
// robin: callers asking for many streams share a few.
constexpr c10::StreamId kPoolSize = 8;
constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

// A device's streams, by id: 0 is the default stream, 1..kPoolSize the pool,
// then one per getNewStream call.
struct DeviceStreams {
  std::mutex mutex;
  std::vector<std::unique_ptr<Queue>> queues;
  std::atomic<c10::StreamId> next_pooled{0};
};

c10::Stream stream_at(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, {kType, device}, id);
}

Queue* make_queue(c10::DeviceIndex device, c10::StreamId id) {
  return new Queue(stream_at(device, id));
}

DeviceStreams& streams_of(c10::DeviceIndex device) {
  // Leaked on purpose: worker threads may still be running at exit.
  static DeviceStreams* all = [] {
    auto* all = new DeviceStreams[device_count()];
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      for (c10::StreamId id = 0; id <= kPoolSize; ++id) {
        all[d].queues.emplace_back(make_queue(d, id));
      }
    }
    return all;
  }();
  return all[device];
}

// Per thread, as in CUDA: a new thread starts on device 0 and default streams.
thread_local c10::DeviceIndex tls_device = 0;
thread_local std::array<c10::StreamId, kMaxDevices> tls_streams{};

std::array<std::atomic<int64_t>, kMaxDevices> touches{};

// A call that CUDA makes on the calling thread's current device.
void touch() {
  touches[tls_device].fetch_add(1, std::memory_order_relaxed);
}

// Index -1 means "the current device", as everywhere in c10.
c10::DeviceIndex checked(c10::DeviceIndex device) {
  if (device < 0) {
    device = tls_device;
  }
  TORCH_CHECK(
      device < device_count(),
      "testdev: device ",
      int(device),
      " does not exist (",
      int(device_count()),
      " devices; TESTDEV_DEVICES sets the count)");
  return device;
}

// What c10::Event points at: the stream and ticket of its latest record().
// The stream's latest task marks the point; tickets already order a stream,
// so recording needs no marker task of its own.
struct Event {
  std::mutex mutex;
  Queue* queue = nullptr; // never recorded: counts as completed, as in CUDA
  uint64_t ticket = 0;
  std::shared_ptr<Capture> capture; // recorded while `queue` captured

  std::pair<Queue*, uint64_t> recorded() {
    std::lock_guard<std::mutex> lock(mutex);
    return {queue, ticket};
  }
  std::shared_ptr<Capture> captured() {
    std::lock_guard<std::mutex> lock(mutex);
    return capture;
  }
};

std::pair<Queue*, uint64_t> recorded(void* event) {
  return event ? static_cast<Event*>(event)->recorded()
               : std::pair<Queue*, uint64_t>{nullptr, 0};
}

// Querying or synchronizing an event of a capture in progress fails, as on
// CUDA, and invalidates the capture.
void refuse_if_captured(void* event, const char* what) {
  if (event == nullptr) {
    return;
  }
  const std::shared_ptr<Capture> capture =
      static_cast<Event*>(event)->captured();
  if (capture == nullptr) {
    return;
  }
  std::lock_guard<std::mutex> lock(capture->mutex);
  if (!capture->active) {
    return;
  }
  capture->invalidated = std::string(what) + " of an event recorded in it";
  TORCH_CHECK(
      false,
      "testdev: operation not permitted when stream is capturing (",
      what,
      " of an event recorded during a graph capture); the capture is "
      "invalidated");
}

// The stream waiting for a captured event joins its capture; the origin
// waiting for one joins that event's stream back.
void join(Queue& waiter, Queue& recorder, const std::shared_ptr<Capture>& capture) {
  std::lock_guard<std::mutex> lock(capture->mutex);
  if (!capture->active) {
    return;
  }
  if (&waiter == capture->origin) {
    capture->rejoined.insert(&recorder);
    return;
  }
  if (waiter.capture() == nullptr) {
    waiter.set_capture(capture);
    capture->joined.insert(&waiter);
  }
}

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kType;
  }

  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    setDevice(device);
    return previous;
  }

  c10::Device getDevice() const override {
    return {kType, tls_device};
  }

  void setDevice(c10::Device device) const override {
    tls_device = checked(device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < device_count()) {
      tls_device = device.index();
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    return current_queue(device.index()).stream();
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return stream_at(checked(device.index()), 0);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*high*/)
      const override {
    const c10::DeviceIndex index = checked(device.index());
    return stream_at(index, 1 + streams_of(index).next_pooled++ % kPoolSize);
  }

  c10::Stream getNewStream(c10::Device device, int /*priority*/)
      const override {
    const c10::DeviceIndex index = checked(device.index());
    auto& streams = streams_of(index);
    std::lock_guard<std::mutex> lock(streams.mutex);
    streams.queues.emplace_back(make_queue(index, streams.queues.size()));
    return streams.queues.back()->stream();
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    const c10::Stream valid = queue_of(stream).stream();
    const c10::Stream previous = current_queue(valid.device_index()).stream();
    tls_streams[valid.device_index()] = valid.id();
    return previous;
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }

  bool queryStream(const c10::Stream& stream) const override {
    touch();
    Queue& queue = queue_of(stream);
    queue.refuse_if_capturing("query");
    return queue.reached(queue.last_ticket());
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    touch();
    queue_of(stream).synchronize();
  }

#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
  bool isStreamCapturing(const c10::Stream& stream) const override {
    return is_capturing(stream);
  }
#endif

  void synchronizeDevice(c10::DeviceIndex device) const override {
    synchronize_device(device);
  }

  void record(
      void** event,
      const c10::Stream& stream,
      c10::DeviceIndex /*device*/,
      c10::EventFlag /*timing is not modelled*/) const override {
    touch();
    if (*event == nullptr) {
      *event = new Event;
    }
    auto* e = static_cast<Event*>(*event);
    Queue& queue = queue_of(stream);
    std::lock_guard<std::mutex> lock(e->mutex);
    e->queue = &queue;
    e->ticket = queue.last_ticket();
    e->capture = queue.capture();
  }

  void block(void* event, const c10::Stream& stream) const override {
    touch();
    const auto [queue, ticket] = recorded(event);
    if (queue == nullptr) {
      return;
    }
    Queue& waiter = queue_of(stream);
    if (auto capture = static_cast<Event*>(event)->captured()) {
      join(waiter, *queue, capture);
      return; // a graph edge, not a wait on work that ran
    }
    waiter.enqueue_wait(*queue, ticket);
  }

  bool queryEvent(void* event) const override {
    touch();
    refuse_if_captured(event, "query");
    const auto [queue, ticket] = recorded(event);
    return queue == nullptr || queue->reached(ticket);
  }

  void synchronizeEvent(void* event) const override {
    touch();
    refuse_if_captured(event, "synchronize");
    const auto [queue, ticket] = recorded(event);
    if (queue != nullptr) {
      queue->wait(ticket);
    }
  }

  void destroyEvent(void* event, c10::DeviceIndex /*device*/)
      const noexcept override {
    touch();
    delete static_cast<Event*>(event);
  }

  void recordDataPtrOnStream(
      const c10::DataPtr& data,
      const c10::Stream& stream) const override {
    record_stream(data, stream);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

} // namespace

c10::DeviceIndex device_count() {
  static const c10::DeviceIndex count = [] {
    const char* env = std::getenv("TESTDEV_DEVICES");
    const int wanted = env != nullptr ? std::atoi(env) : 2;
    return static_cast<c10::DeviceIndex>(
        std::clamp<int>(wanted, 1, kMaxDevices));
  }();
  return count;
}

c10::DeviceIndex current_device() {
  return tls_device;
}

Queue& queue_of(const c10::Stream& stream) {
  TORCH_CHECK(
      stream.device_type() == kType,
      "testdev: not a testdev stream: ",
      describe(stream));
  auto& streams = streams_of(checked(stream.device_index()));
  std::lock_guard<std::mutex> lock(streams.mutex);
  TORCH_CHECK(
      stream.id() >= 0 &&
          static_cast<size_t>(stream.id()) < streams.queues.size(),
      "testdev: unknown stream ",
      describe(stream));
  return *streams.queues[stream.id()];
}

Queue& current_queue(c10::DeviceIndex device) {
  device = checked(device);
  auto& streams = streams_of(device);
  std::lock_guard<std::mutex> lock(streams.mutex);
  return *streams.queues[tls_streams[device]];
}

std::vector<int64_t> device_touches() {
  std::vector<int64_t> counts;
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    counts.push_back(touches[d].load());
  }
  return counts;
}

void reset_device_touches() {
  for (auto& count : touches) {
    count.store(0);
  }
}

void capture_begin(const c10::Stream& stream) {
  Queue& origin = queue_of(stream);
  TORCH_CHECK(
      stream.id() != 0,
      "testdev: cannot capture the default stream ",
      describe(stream),
      " (as on CUDA: capture on a side stream)");
  TORCH_CHECK(
      origin.capture() == nullptr, describe(stream), " is already capturing");
  auto capture = std::make_shared<Capture>();
  capture->origin = &origin;
  origin.set_capture(capture);
}

int64_t capture_end(const c10::Stream& stream) {
  Queue& origin = queue_of(stream);
  const std::shared_ptr<Capture> capture = origin.capture();
  TORCH_CHECK(
      capture != nullptr && capture->origin == &origin,
      describe(stream),
      " is not the origin of a capture");
  std::string unjoined, invalidated;
  {
    std::lock_guard<std::mutex> lock(capture->mutex);
    capture->active = false;
    invalidated = capture->invalidated;
    for (Queue* queue : capture->joined) {
      queue->set_capture(nullptr);
      if (capture->rejoined.count(queue) == 0) {
        unjoined += (unjoined.empty() ? "" : ", ") + describe(queue->stream());
      }
    }
  }
  origin.set_capture(nullptr);
  TORCH_CHECK(
      invalidated.empty(),
      "testdev: the capture on ",
      describe(stream),
      " was invalidated (",
      invalidated,
      ")");
  TORCH_CHECK(
      unjoined.empty(),
      "testdev: capture on ",
      describe(stream),
      " ended with streams that joined it and were not joined back (",
      unjoined,
      ")");
  return capture->tasks_recorded.load();
}

bool is_capturing(const c10::Stream& stream) {
  return queue_of(stream).capture() != nullptr;
}

bool launch_host_func(const c10::Stream& stream, void (*fn)(void*), void* data) {
  Queue& queue = queue_of(stream);
  if (queue.capture()) {
    return false;
  }
  queue.enqueue([fn, data] { fn(data); });
  return true;
}

void synchronize_device(c10::DeviceIndex device) {
  auto& streams = streams_of(checked(device));
  std::vector<Queue*> queues;
  {
    std::lock_guard<std::mutex> lock(streams.mutex);
    for (const auto& queue : streams.queues) {
      queues.push_back(queue.get());
    }
  }
  for (Queue* queue : queues) {
    queue->synchronize();
  }
}

} // namespace testdev
