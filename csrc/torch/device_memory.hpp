// How a device's memory reaches the NIC (GPUDirect RDMA,
// docs/ACCELERATORS.md): registered by dma-buf, by pointer (a peer-memory
// kernel module lets ibv_reg_mr take device addresses), or not at all (the
// call is staged through pinned host memory). Answered before a call is
// issued, so a call never discovers mid-way that its memory cannot be
// registered.
#pragma once
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../common/setting_enums.hpp"

namespace roce::adapter {

enum class DeviceMemoryPath { Staged, Pointer, Dmabuf };

const char* pathName(DeviceMemoryPath p);

// What the device side can do; the NIC's side is the provider's answer.
struct DeviceMemoryAnswer {
  bool dmabuf = false;  // its memory can be exported as dma-bufs (an export hook, and the driver agrees)
  std::string dmabufWhy;
  bool pointer = false;  // ibv_reg_mr takes its pointers (peer-memory module, or declared)
  std::string pointerWhy;
  int (*exportDmabuf)(const void* base, size_t len, int deviceIndex, uint64_t* offset) = nullptr;
  // Where NIC writes must be flushed before the device's kernels read them
  // (CUDA before compute capability 9.0): called once received data is
  // complete, before anything on the device may read it; false if it failed.
  bool (*flushNicWrites)(int deviceIndex) = nullptr;
  std::string flushWhy;
  // The id of the allocation holding `p` (BufferOwner::bufferId), 0 if
  // unknown; null: the device type gives none (registrations are then
  // checked by address and length only).
  uint64_t (*bufferId)(const void* p, int deviceIndex) = nullptr;
};

// Declares that memory of `type` is registrable by pointer (true) or never
// reaches the NIC (false), overriding detection: for PrivateUse1 backends
// (the test device's peer-memory mode) and tests.
// `bufferId`: the device type's allocation ids (see DeviceMemoryAnswer), or null.
void declareDeviceMemory(c10::DeviceType type, bool pointer, std::string why,
                         uint64_t (*bufferId)(const void* p, int deviceIndex) = nullptr);

// The declaration if any; for CUDA: dma-buf where the driver exports them
// (cuda_driver.hpp), by pointer where nvidia_peermem (or nv_peer_mem) is in
// /proc/modules. Other device types: neither. Thread-safe.
DeviceMemoryAnswer deviceMemoryPath(c10::Device device);

// Whether a call's device tensor goes to the transport itself, and how,
// from what every rank sees alike: `mode` (ROCE_PG_GPUDIRECT), the device's
// answer, the provider's (`nicDmabuf`, `nicWhy`), the transports serving the
// ranks the call talks to (`peers`), whether the call is a collective of a group some machine of
// which holds several ranks (`sharedMachine`: those ranks reach each other
// through shared memory, so all must stage), the largest buffer the call
// moves (as every rank computes it) against ROCE_PG_IB_DEVICE_REG_BYTES.
// `why` says what decided, for the log line.
struct GpudirectChoice {
  DeviceMemoryPath path = DeviceMemoryPath::Staged;
  std::string why;
  decltype(DeviceMemoryAnswer::exportDmabuf) exportDmabuf = nullptr;  // the device's hook, for Dmabuf
  decltype(DeviceMemoryAnswer::flushNicWrites) flushNicWrites = nullptr;  // the device's, unless staged
  decltype(DeviceMemoryAnswer::bufferId) bufferId = nullptr;  // the device's, unless staged
};
// A rank the call talks to and the name of the transport serving it.
using CallPeer = std::pair<int, const char*>;
GpudirectChoice chooseGpudirect(GpudirectMode mode, const DeviceMemoryAnswer& device, bool nicDmabuf,
                                const std::string& nicWhy, const std::vector<CallPeer>& peers,
                                bool sharedMachine, size_t callBytes, size_t limitBytes);

// True if /proc/modules' text lists a peer-memory module for NVIDIA GPUs.
bool peerMemoryModuleLoaded(const std::string& modulesText);

}  // namespace roce::adapter
