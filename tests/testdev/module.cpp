// Python bindings: the knobs and counters tests use (wrapped in __init__.py).

#include "testdev.h"

#include <torch/extension.h>

#include <chrono>
#include <thread>

namespace {

c10::Stream stream_at(int64_t stream_id, int device) {
  return c10::Stream(
      c10::Stream::UNSAFE,
      {c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)},
      stream_id);
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("device_count", [] {
    return static_cast<int>(testdev::device_count());
  });
  m.def(
      "sleep_on_stream",
      [](double ms, int64_t stream_id, int device) {
        testdev::queue_of(stream_at(stream_id, device)).enqueue([ms] {
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::milli>(ms));
        });
      },
      "Keeps the stream busy for `ms` milliseconds (a slow kernel).");
  m.def("device_touches", &testdev::device_touches);
  m.def("buffer_id", [](uintptr_t ptr) {
    return testdev::device_buffer_id(reinterpret_cast<const void*>(ptr), 0);
  });
  m.def("host_func_function", [] {
    return reinterpret_cast<uintptr_t>(&testdev::launch_host_func);
  });
  m.def("buffer_id_function", [] {
    return reinterpret_cast<uintptr_t>(&testdev::device_buffer_id);
  });
  m.def("reset_device_touches", &testdev::reset_device_touches);
  m.def("capture_begin", [](int64_t stream_id, int device) {
    testdev::capture_begin(stream_at(stream_id, device));
  });
  m.def("capture_end", [](int64_t stream_id, int device) {
    return testdev::capture_end(stream_at(stream_id, device));
  });
  m.def("is_capturing", [](int64_t stream_id, int device) {
    return testdev::is_capturing(stream_at(stream_id, device));
  });
  m.def("set_copy_delay_ms", &testdev::set_copy_delay_ms);
  m.def("copy_concurrency", &testdev::copy_concurrency);
  m.def("reset_copy_concurrency", &testdev::reset_copy_concurrency);
  m.def("device_counters", &testdev::device_counters);
  m.def("host_counters", &testdev::host_counters);
  m.def("reset_counters", &testdev::reset_counters);
  // It waits for the streams, whose tasks may free Python-owned tensors.
  m.def(
      "empty_cache",
      &testdev::empty_cache,
      py::call_guard<py::gil_scoped_release>());
}
