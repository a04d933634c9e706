// Turning the tensors a c10d call receives into the contiguous host buffers the
// algorithms work on, and back. CPU contiguous tensors are used in place;
// non-contiguous CPU tensors go through a contiguous host copy; device tensors
// through pinned host buffers filled and drained on the group's copy streams
// (device_staging.hpp).
#pragma once
#include <ATen/ATen.h>
#include <cstdint>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <memory>
#include <vector>

#include "../common/dtype.hpp"
#include "device_staging.hpp"

namespace roce::adapter {

struct Staged {
  at::Tensor user;  // what the caller passed
  at::Tensor host;  // contiguous CPU tensor the algorithms read / write
  bool copyBack = false;

  void* data() const { return host.data_ptr(); }
  size_t bytes() const { return host.numel() * host.element_size(); }
  // Runs on the progress thread once the operation succeeded (CPU tensors;
  // device tensors are copied back by DeviceStaging).
  void finish() const;
};

// readable: the algorithm reads the current contents (inputs, in-place ops).
// CPU tensors only.
Staged stage(const at::Tensor& t, bool readable);

// The host buffers of one call, the same calls for CPU and device tensors:
// each returns the contiguous host tensor the algorithm works on. CPU: as
// stage() above; cpuOutputs lists the buffers results land in (zero-copy
// transports may register them), and the task writes back those that are
// copies once the operation succeeded. Device: pinned buffers, copied in and
// back asynchronously by `device`.
class CallStaging {
 public:
  CallStaging() = default;  // CPU tensors
  explicit CallStaging(std::shared_ptr<DeviceStaging> device, bool direct = false)
      : device(std::move(device)), direct(direct) {}

  // Holds t's contents.
  at::Tensor input(const at::Tensor& t);
  // Holds the contents of ts one after another.
  at::Tensor inputs(const std::vector<at::Tensor>& ts);
  // Copied into t when the operation ends.
  at::Tensor output(const at::Tensor& t);
  // Consecutive slices copied into ts when the operation ends.
  at::Tensor outputs(const std::vector<at::Tensor>& ts);
  // t as `rows` blocks cut alike by the pieces of a staged device call
  // (DeviceStaging::add): the host buffer holds piece after piece, each as
  // rows x its count (with one piece, or on the CPU, t's own layout). read:
  // holds t's contents; write: copied into t.
  at::Tensor rows(const at::Tensor& t, int64_t rows, bool read, bool write);
  // Element-wise operations on ts in place, as one flat buffer: read: holds
  // their contents; write: copied back. On devices, pieces of it are copied
  // in and back as the operation proceeds (DeviceStaging::start).
  at::Tensor inPlace(const std::vector<at::Tensor>& ts, bool read, bool write);

  std::vector<Staged> cpuOutputs;
  std::shared_ptr<DeviceStaging> device;  // null for CPU tensors
  // GPUDirect RDMA (device only): single contiguous tensors are handed to the
  // algorithm as they are, lists, non-contiguous tensors and views of
  // storages over `directLimit` bytes through one device buffer (the
  // transport registers whole storages); no host buffer
  // (RoceBackend::gpudirect decided).
  bool direct = false;
  size_t directLimit = 0;
  // direct by dma-buf: the device type's export (device_memory.hpp); null: by pointer.
  int (*exportDmabuf)(const void* base, size_t len, int deviceIndex, uint64_t* offset) = nullptr;
  // direct, on devices that need it: makes what the NIC wrote visible to the
  // device's later work (device_memory.hpp); null: nothing to do.
  bool (*flushNicWrites)(int deviceIndex) = nullptr;
  // direct: the device type's allocation ids (BufferOwner::bufferId); null: none.
  uint64_t (*bufferId)(const void* p, int deviceIndex) = nullptr;
  // Runs flushNicWrites, if any, for the call's device; throws if it failed.
  void flushReceived() const;

 private:
  // direct: t itself, flat; or, where it cannot go as it is, a device buffer
  // copied from t (read) and back into it (write).
  at::Tensor directly(const at::Tensor& t, bool read, bool write);
};

// Argument checks that raise c10::Error naming the operation. Tensors may be
// on the CPU or on any device with streams (CUDA, ROCm, PrivateUse1, ...).
void checkTensor(const at::Tensor& t, const char* op);
void checkSingle(const std::vector<at::Tensor>& ts, const char* op);
void checkSameDevice(const at::Tensor& a, const at::Tensor& b, const char* op);
void checkSameDeviceAndDtype(const at::Tensor& a, const at::Tensor& b, const char* op);
void checkRank(int64_t r, int size, const char* what, const char* op);

// For reductions: the dtype the kernels know, or an error naming it.
DataType reductionType(const at::Tensor& t, const char* op);

}  // namespace roce::adapter
