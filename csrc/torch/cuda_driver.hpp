// What GPUDirect RDMA needs of the CUDA driver: its memory as a dma-buf for
// ibv_reg_dmabuf_mr, and the flush of NIC writes on GPUs that do not order
// them. Through the driver API loaded at run time (dlopen("libcuda.so.1")):
// no CUDA header or library at build time, and a machine without a driver
// simply answers "unsupported". Not exercised without a GPU
// (docs/ACCELERATORS.md says what was verified).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace roce::adapter {

// Whether CUDA device `index` can export dma-bufs: the driver loads, and
// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is set. `why` says what decided.
bool cudaDmabufSupported(int index, std::string* why);

// A dma-buf fd (the caller closes it) for the allocation holding
// [ptr, ptr + len) on CUDA device `index`, and ptr's offset within it; -1 on
// failure. The allocation's base, from cuMemGetAddressRange: the caching
// allocator packs tensors into larger blocks, and the driver exports whole
// page-aligned ranges.
int exportCudaDmabuf(const void* ptr, size_t len, int index, uint64_t* offset);

// Whether data a NIC wrote into CUDA device `index` must be flushed before
// the device's kernels may read it: its
// CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING is below OWNER (GPUs
// before compute capability 9.0), or unknown. `why` says what decided.
bool cudaRdmaWritesNeedFlush(int index, std::string* why);

// cuFlushGPUDirectRDMAWrites(current context, to owner) under the device's
// primary context: returns once the NIC writes that completed so far are
// visible to work queued on the device afterwards. False if it failed.
bool flushCudaRdmaWrites(int index);

// Whether the CUDA stream `stream` (a CUstream: c10::Stream::native_handle())
// is capturing a graph (cuStreamIsCapturing). False without a driver.
bool cudaStreamCapturing(void* stream);

// CU_POINTER_ATTRIBUTE_BUFFER_ID of the allocation holding `ptr` on CUDA
// device `index`: unique to that allocation for the process's life; 0 if the
// driver cannot tell.
uint64_t cudaBufferId(const void* ptr, int index);

// Whether the driver offers cuLaunchHostFunc and what it needs (CUDA 10+).
bool cudaHostFnSupported();
// fn(data) on a driver thread once the CUDA event `event` (a CUevent:
// c10::Event::eventId()) of device `index` has completed: a stream of
// roce's own (one per calling thread and device, non-blocking, never handed
// to anyone, so nothing queued there by others, or by another group's
// thread, can delay the call or capture it) waits for the event, then runs
// cuLaunchHostFunc. False if it was not queued.
bool cudaHostFnAfterEvent(void* event, int index, void (*fn)(void*), void* data);

// Puts the calling thread in thread-local stream-capture mode
// (cuThreadExchangeStreamCaptureMode): under a capture another thread began
// in the default, global mode, this thread's event queries would otherwise
// be refused and invalidate that capture. For threads that never capture.
void cudaThreadLocalCaptureMode();

}  // namespace roce::adapter
