#include "cuda_dmabuf.hpp"

#include <dlfcn.h>

namespace roce {
namespace {

// The few driver API declarations used (cuda.h, CUDA 11.7+); CUresult 0 is CUDA_SUCCESS.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
constexpr int kDmaBufSupported = 124;      // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
constexpr int kRangeHandleDmaBufFd = 0x1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

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
    if (d.missing.empty() && d.init(0) != 0) d.missing = "cuInit failed";
    return d;
  }();
  return d;
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
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  // The progress thread may have no current context: the device's primary
  // one (the context PyTorch allocates in) for the duration of the calls.
  if (d.deviceGet(&dev, index) != 0 || d.retain(&ctx, dev) != 0) return -1;
  int fd = -1;
  if (d.push(ctx) == 0) {
    CUdeviceptr base = 0;
    size_t size = 0;
    const auto p = reinterpret_cast<CUdeviceptr>(ptr);
    if (d.addressRange(&base, &size, p) == 0 && p + len <= base + size &&
        d.handle(&fd, base, size, kRangeHandleDmaBufFd, 0) == 0)
      *offset = p - base;
    else
      fd = -1;
    CUcontext popped = nullptr;
    d.pop(&popped);
  }
  d.release(dev);
  return fd;
}

}  // namespace roce
