#include "cuda_driver.hpp"

#include <cstdint>
#include <dlfcn.h>

#include <map>

namespace roce::adapter {
namespace {

// The few driver API declarations used (cuda.h, CUDA 11.7+); CUresult 0 is CUDA_SUCCESS.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
constexpr int kDmaBufSupported = 124;      // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
constexpr int kRangeHandleDmaBufFd = 0x1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
constexpr int kRdmaWritesOrdering = 118;   // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING
constexpr int kOrderingOwner = 100;        // CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER
constexpr int kFlushTargetCurrentCtx = 0;  // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX
constexpr int kFlushToOwner = 100;         // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER
constexpr int kPointerBufferId = 7;        // CU_POINTER_ATTRIBUTE_BUFFER_ID (unsigned long long)
constexpr int kCaptureModeThreadLocal = 1;  // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL

struct Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*deviceGet)(CUdevice*, int) = nullptr;
  CUresult (*attribute)(int*, int, CUdevice) = nullptr;
  CUresult (*retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*release)(CUdevice) = nullptr;
  CUresult (*push)(CUcontext) = nullptr;
  CUresult (*pop)(CUcontext*) = nullptr;
  CUresult (*addressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*handle)(void*, CUdeviceptr, size_t, int, unsigned long long) = nullptr;
  CUresult (*flush)(int target, int scope) = nullptr;  // CUDA 11.3+
  CUresult (*isCapturing)(void* stream, int* status) = nullptr;  // optional: null answers "not capturing"
  CUresult (*pointerAttribute)(void* data, int attribute, CUdeviceptr ptr) = nullptr;  // optional: null, no buffer ids
  CUresult (*captureMode)(int* mode) = nullptr;  // optional
  CUresult (*launchHostFunc)(void* stream, void (*fn)(void*), void* data) = nullptr;  // optional: null, waits poll
  CUresult (*streamCreate)(void** stream, unsigned flags) = nullptr;                  // with launchHostFunc
  CUresult (*streamWaitEvent)(void* stream, void* event, unsigned flags) = nullptr;   // with launchHostFunc
  CUresult (*streamDestroy)(void* stream) = nullptr;                                  // optional
  std::string missing;  // why the driver cannot be used; empty when it can
};

template <class F>
void bind(void* lib, const char* name, F& f, std::string& missing) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f && missing.empty()) missing = std::string("libcuda.so.1 has no ") + name + " (driver older than CUDA 11.7)";
}

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      d.missing = "libcuda.so.1 cannot be loaded (no NVIDIA driver)";
      return d;
    }
    bind(lib, "cuInit", d.init, d.missing);
    bind(lib, "cuDeviceGet", d.deviceGet, d.missing);
    bind(lib, "cuDeviceGetAttribute", d.attribute, d.missing);
    bind(lib, "cuDevicePrimaryCtxRetain", d.retain, d.missing);
    bind(lib, "cuDevicePrimaryCtxRelease_v2", d.release, d.missing);
    bind(lib, "cuCtxPushCurrent_v2", d.push, d.missing);
    bind(lib, "cuCtxPopCurrent_v2", d.pop, d.missing);
    bind(lib, "cuMemGetAddressRange_v2", d.addressRange, d.missing);
    bind(lib, "cuMemGetHandleForAddressRange", d.handle, d.missing);
    bind(lib, "cuFlushGPUDirectRDMAWrites", d.flush, d.missing);
    d.isCapturing = reinterpret_cast<decltype(d.isCapturing)>(dlsym(lib, "cuStreamIsCapturing"));
    d.pointerAttribute = reinterpret_cast<decltype(d.pointerAttribute)>(dlsym(lib, "cuPointerGetAttribute"));
    d.captureMode = reinterpret_cast<decltype(d.captureMode)>(dlsym(lib, "cuThreadExchangeStreamCaptureMode"));
    d.launchHostFunc = reinterpret_cast<decltype(d.launchHostFunc)>(dlsym(lib, "cuLaunchHostFunc"));
    d.streamCreate = reinterpret_cast<decltype(d.streamCreate)>(dlsym(lib, "cuStreamCreate"));
    d.streamWaitEvent = reinterpret_cast<decltype(d.streamWaitEvent)>(dlsym(lib, "cuStreamWaitEvent"));
    d.streamDestroy = reinterpret_cast<decltype(d.streamDestroy)>(dlsym(lib, "cuStreamDestroy_v2"));
    if (d.missing.empty() && d.init(0) != 0) d.missing = "cuInit failed";
    return d;
  }();
  return d;
}

// Runs fn() with device `index`'s primary context current (the context
// PyTorch allocates in): the progress thread may have none. False if the
// context could not be made current.
template <class Fn>
bool inPrimaryContext(const Driver& d, int index, Fn&& fn) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (d.deviceGet(&dev, index) != 0 || d.retain(&ctx, dev) != 0) return false;
  const bool pushed = d.push(ctx) == 0;
  if (pushed) {
    fn();
    CUcontext popped = nullptr;
    d.pop(&popped);
  }
  d.release(dev);
  return pushed;
}

}  // namespace

bool cudaDmabufSupported(int index, std::string* why) {
  const Driver& d = driver();
  if (!d.missing.empty()) return *why = d.missing, false;
  CUdevice dev = 0;
  int supported = 0;
  if (d.deviceGet(&dev, index) != 0 || d.attribute(&supported, kDmaBufSupported, dev) != 0)
    return *why = "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) failed", false;
  *why = supported ? "the driver exports dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)"
                   : "the driver does not export dma-bufs on this GPU (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0; "
                     "needs the open kernel modules or a recent driver)";
  return supported != 0;
}

int exportCudaDmabuf(const void* ptr, size_t len, int index, uint64_t* offset) {
  const Driver& d = driver();
  if (!d.missing.empty()) return -1;
  int fd = -1;
  inPrimaryContext(d, index, [&] {
    CUdeviceptr base = 0;
    size_t size = 0;
    const auto p = reinterpret_cast<CUdeviceptr>(ptr);
    if (d.addressRange(&base, &size, p) == 0 && p + len <= base + size &&
        d.handle(&fd, base, size, kRangeHandleDmaBufFd, 0) == 0)
      *offset = p - base;
    else
      fd = -1;
  });
  return fd;
}

bool cudaRdmaWritesNeedFlush(int index, std::string* why) {
  const Driver& d = driver();
  // PyTorch's CUDA needs a driver far newer than 11.7; should one still lack
  // the calls, say so where the path is logged.
  if (!d.missing.empty())
    return *why = d.missing + ": NIC writes cannot be flushed (on GPUs before compute capability 9.0 set "
                              "ROCE_PG_GPUDIRECT=off)", false;
  CUdevice dev = 0;
  int ordering = 0;
  if (d.deviceGet(&dev, index) != 0 || d.attribute(&ordering, kRdmaWritesOrdering, dev) != 0)
    return *why = "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING unknown: NIC writes are flushed", true;
  if (ordering >= kOrderingOwner)
    return *why = "the GPU orders NIC writes before its own reads (GPU_DIRECT_RDMA_WRITES_ORDERING >= OWNER): "
                  "no flush", false;
  *why = "the GPU does not order NIC writes (GPU_DIRECT_RDMA_WRITES_ORDERING = NONE): "
         "cuFlushGPUDirectRDMAWrites after each receive";
  return true;
}

bool cudaStreamCapturing(void* stream) {
  const Driver& d = driver();
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE; ACTIVE and INVALIDATED both mean "in a capture"
  return d.missing.empty() && d.isCapturing && d.isCapturing(stream, &status) == 0 && status != 0;
}

uint64_t cudaBufferId(const void* ptr, int index) {
  const Driver& d = driver();
  if (!d.missing.empty() || !d.pointerAttribute) return 0;
  unsigned long long id = 0;
  inPrimaryContext(d, index, [&] {
    if (d.pointerAttribute(&id, kPointerBufferId, reinterpret_cast<CUdeviceptr>(ptr)) != 0) id = 0;
  });
  return id;
}

bool cudaHostFnSupported() {
  const Driver& d = driver();
  return d.missing.empty() && d.launchHostFunc && d.streamCreate && d.streamWaitEvent;
}

namespace {
// The calling thread's notice streams, by device: each progress thread (one
// per group) waits for one event at a time, so a group's notice never
// queues behind another group's, nor behind an event of another thread that
// will never complete. Destroyed with the thread (cuStreamDestroy returns at
// once; work still queued completes first).
class NoticeStreams {
 public:
  ~NoticeStreams() {
    const Driver& d = driver();
    for (auto [index, stream] : streams_)
      if (stream && d.streamDestroy) inPrimaryContext(d, index, [&, stream = stream] { d.streamDestroy(stream); });
  }
  // Under device `index`'s primary context.
  void* of(int index) {
    constexpr unsigned kNonBlocking = 0x1;  // CU_STREAM_NON_BLOCKING: no implicit sync with the legacy default stream
    void*& stream = streams_[index];
    if (!stream && driver().streamCreate(&stream, kNonBlocking) != 0) stream = nullptr;
    return stream;
  }

 private:
  std::map<int, void*> streams_;
};
}  // namespace

bool cudaHostFnAfterEvent(void* event, int index, void (*fn)(void*), void* data) {
  if (!cudaHostFnSupported() || !event) return false;
  const Driver& d = driver();
  thread_local NoticeStreams streams;
  CUresult r = -1;
  const bool inContext = inPrimaryContext(d, index, [&] {
    void* stream = streams.of(index);
    if (stream && d.streamWaitEvent(stream, event, 0) == 0) r = d.launchHostFunc(stream, fn, data);
  });
  return inContext && r == 0;
}

void cudaThreadLocalCaptureMode() {
  const Driver& d = driver();
  int mode = kCaptureModeThreadLocal;
  if (d.missing.empty() && d.captureMode) d.captureMode(&mode);
}

bool flushCudaRdmaWrites(int index) {
  const Driver& d = driver();
  if (!d.missing.empty()) return false;
  CUresult r = -1;
  return inPrimaryContext(d, index, [&] { r = d.flush(kFlushTargetCurrentCtx, kFlushToOwner); }) && r == 0;
}

}  // namespace roce::adapter
