// Python bindings: the knobs and counters tests use (wrapped in __init__.py).

#include "testdev.h"

#include <torch/extension.h>

#include <chrono>
#include <thread>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("device_count", [] {
    return static_cast<int>(testdev::device_count());
  });
  m.def(
      "sleep_on_stream",
      [](double ms, int64_t stream_id, int device) {
        const c10::Stream stream(
            c10::Stream::UNSAFE,
            {c10::DeviceType::PrivateUse1,
             static_cast<c10::DeviceIndex>(device)},
            stream_id);
        testdev::queue_of(stream).enqueue([ms] {
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::milli>(ms));
        });
      },
      "Keeps the stream busy for `ms` milliseconds (a slow kernel).");
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
