// Kernels the device implements itself: factories and views (metadata, as on
// any device), copies (queued on a stream, with CUDA's blocking rules),
// record_stream and resize_.

#include "testdev.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <chrono>
#include <thread>

namespace testdev {
namespace {

std::atomic<double> copy_delay_ms{0.0};
std::atomic<int64_t> copies_running{0};
std::atomic<int64_t> copies_running_peak{0};

// Held while a host<->device copy runs on its stream (the delay included).
struct CopyRunning {
  CopyRunning() {
    const int64_t now = ++copies_running;
    int64_t peak = copies_running_peak.load();
    while (now > peak && !copies_running_peak.compare_exchange_weak(peak, now)) {
    }
  }
  ~CopyRunning() {
    --copies_running;
  }
};

constexpr c10::DispatchKeySet kDeviceKeys(c10::DispatchKey::PrivateUse1);

// Rejects what device memory cannot be, and makes the device current so
// that the allocator serves the current stream of the right device.
c10::DeviceGuard guard_for_new_tensor(
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  TORCH_CHECK(
      c10::layout_or_default(layout) == c10::Layout::Strided,
      "testdev: only strided tensors");
  TORCH_CHECK(
      !c10::pinned_memory_or_default(pin_memory),
      "testdev: only CPU memory can be pinned");
  return c10::DeviceGuard(c10::device_or_default(device));
}

at::Tensor empty_memory_format(
    at::IntArrayRef size,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  const auto guard = guard_for_new_tensor(layout, device, pin_memory);
  return at::detail::empty_generic(
      size,
      c10::GetAllocator(c10::DeviceType::PrivateUse1),
      kDeviceKeys,
      c10::dtype_or_default(dtype),
      memory_format);
}

at::Tensor empty_strided(
    at::IntArrayRef size,
    at::IntArrayRef stride,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  const auto guard = guard_for_new_tensor(layout, device, pin_memory);
  return at::detail::empty_strided_generic(
      size,
      stride,
      c10::GetAllocator(c10::DeviceType::PrivateUse1),
      kDeviceKeys,
      c10::dtype_or_default(dtype));
}

void sleep_copy_delay() {
  const double ms = copy_delay_ms.load();
  if (ms > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  }
}

// Host<->device copies go on the device side's current stream; blocking ones
// then wait for that stream (cudaMemcpyAsync + cudaStreamSynchronize).
// Device<->device copies never block the host. They run on the source's
// current stream and, across devices, both current streams wait for each
// other around the copy, as CUDA does for peer copies.
at::Tensor copy_from(
    const at::Tensor& src,
    const at::Tensor& dst,
    bool non_blocking) {
  if (dst.numel() == 0) {
    return dst;
  }
  if (src.is_cpu() || dst.is_cpu()) {
    const bool to_device = src.is_cpu();
    Queue& queue = current_queue((to_device ? dst : src).device().index());
    // The host tensor is captured, which keeps its memory alive until the
    // copy ran; device memory is referenced only through the alias, so its
    // lifetime stays the caller's business, as on a GPU.
    queue.enqueue([to = to_device ? cpu_alias(dst) : dst,
                   from = to_device ? src : cpu_alias(src)]() mutable {
      const CopyRunning running;
      sleep_copy_delay();
      to.copy_(from);
    });
    if (!non_blocking) {
      queue.synchronize();
    }
    return dst;
  }
  Queue& queue = current_queue(src.device().index());
  Queue& other = current_queue(dst.device().index());
  queue.enqueue_wait(other, other.last_ticket());
  const uint64_t copied = queue.enqueue(
      [to = cpu_alias(dst), from = cpu_alias(src)]() mutable {
        to.copy_(from);
      });
  other.enqueue_wait(queue, copied);
  return dst;
}

void record_stream_kernel(at::Tensor& self, c10::Stream stream) {
  record_stream(self.storage().data_ptr(), stream);
}

// Growing a tensor copies its old bytes on the host, so the kernels queued
// on the current stream must have finished.
const at::Tensor& resize_(
    const at::Tensor& self,
    at::IntArrayRef size,
    std::optional<c10::MemoryFormat> memory_format) {
  current_queue(self.device().index()).synchronize();
  return at::native::resize_(self, size, memory_format);
}

} // namespace

at::Tensor cpu_alias(const at::Tensor& t) {
  // Resizable, so that a CPU kernel may resize an out= argument (it then
  // gets CPU memory of its own; the fallback copies it back).
  at::Tensor alias = at::for_blob(t.storage().mutable_data(), t.sizes())
                         .strides(t.strides())
                         .storage_offset(t.storage_offset())
                         .options(t.options().device(c10::kCPU))
                         .allocator(c10::GetCPUAllocator())
                         .resizeable_storage()
                         .make_tensor();
  alias._set_conj(t.is_conj());
  alias._set_neg(t.is_neg());
  return alias;
}

void set_copy_delay_ms(double ms) {
  copy_delay_ms.store(ms);
}

std::map<std::string, int64_t> copy_concurrency() {
  return {{"running", copies_running.load()}, {"peak", copies_running_peak.load()}};
}

void reset_copy_concurrency() {
  copies_running_peak.store(copies_running.load());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  // Views that change the dtype (torch.distributed hands complex tensors to
  // backends as view_as_real): metadata only, as on any device.
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("record_stream", TORCH_FN(record_stream_kernel));
  // Setting a storage is metadata only; the CPU versions work on any device.
  m.impl(
      "set_.source_Storage_storage_offset",
      TORCH_FN(at::native::set_storage_cpu_));
  m.impl("set_.source_Storage", TORCH_FN(at::native::set_));
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
}

} // namespace testdev
