#include "device_memory.hpp"

#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "cuda_driver.hpp"
#include "device_declarations.hpp"

namespace roce::adapter {
namespace {

std::mutex mu;  // the CUDA answers below
DeviceDeclarations<DeviceMemoryAnswer>& declared() {
  static DeviceDeclarations<DeviceMemoryAnswer> d;
  return d;
}

std::string procModules() {
  std::ifstream f("/proc/modules");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

const char* pathName(DeviceMemoryPath p) {
  switch (p) {
    case DeviceMemoryPath::Dmabuf: return "dma-buf";
    case DeviceMemoryPath::Pointer: return "peer memory";
    default: return "staged";
  }
}

void declareDeviceMemory(c10::DeviceType type, bool pointer, std::string why,
                         uint64_t (*bufferId)(const void* p, int deviceIndex)) {
  DeviceMemoryAnswer a;
  a.bufferId = bufferId;
  a.dmabufWhy = c10::DeviceTypeName(type, true) + " has no dma-buf export hook (unsupported)";
  a.pointer = pointer;
  a.pointerWhy = std::move(why);
  declared().set(type, std::move(a));
}

bool peerMemoryModuleLoaded(const std::string& modulesText) {
  std::istringstream in(modulesText);
  std::string line;
  while (std::getline(in, line)) {
    const std::string name = line.substr(0, line.find(' '));
    if (name == "nvidia_peermem" || name == "nv_peer_mem") return true;
  }
  return false;
}

DeviceMemoryAnswer deviceMemoryPath(c10::Device device) {
  if (auto declaration = declared().find(device.type())) return *declaration;
  DeviceMemoryAnswer a;
  const std::string type = c10::DeviceTypeName(device.type(), true);
  if (device.type() != c10::DeviceType::CUDA) {
    a.dmabufWhy = type + " has no dma-buf export hook";
    a.pointerWhy = "no peer-memory registration is known for " + type + " (roce_pg.declare_device_memory)";
    return a;
  }
  // Asked per call (broadcast, send/recv of a device tensor): the driver's
  // and the kernel's answers are read once per device and kept.
  static std::map<int, DeviceMemoryAnswer> cuda;
  const int index = device.has_index() ? device.index() : 0;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = cuda.find(index);
    if (it != cuda.end()) return it->second;
  }
  a.dmabuf = cudaDmabufSupported(index, &a.dmabufWhy);
  if (a.dmabuf) a.exportDmabuf = exportCudaDmabuf;
  if (cudaRdmaWritesNeedFlush(index, &a.flushWhy)) a.flushNicWrites = flushCudaRdmaWrites;
  a.bufferId = cudaBufferId;
  a.pointer = peerMemoryModuleLoaded(procModules());
  a.pointerWhy = a.pointer ? "nvidia_peermem is loaded (/proc/modules): ibv_reg_mr takes device pointers"
                           : "no peer-memory module loaded (nvidia_peermem not in /proc/modules)";
  std::lock_guard<std::mutex> g(mu);
  return cuda.emplace(index, a).first->second;
}

namespace {
std::string flushNote(const DeviceMemoryAnswer& device) {
  return device.flushWhy.empty() ? "" : "; " + device.flushWhy;
}
}  // namespace

GpudirectChoice chooseGpudirect(GpudirectMode mode, const DeviceMemoryAnswer& device, bool nicDmabuf,
                                const std::string& nicWhy, const std::vector<CallPeer>& peers,
                                bool sharedMachine, size_t callBytes, size_t limitBytes) {
  if (mode == GpudirectMode::Off) return {DeviceMemoryPath::Staged, "ROCE_PG_GPUDIRECT=off"};
  for (const auto& [p, transport] : peers)
    if (std::string(transport) != "verbs")
      return {DeviceMemoryPath::Staged, "rank " + std::to_string(p) + " is reached through " + transport +
                                            ", which copies with the CPU (only verbs takes device memory)"};
  if (sharedMachine)
    return {DeviceMemoryPath::Staged, "a machine of this group holds several of its ranks, whose shared-memory "
                                      "transport copies with the CPU; collectives go to the NIC directly only with "
                                      "one rank per machine"};
  if (callBytes > limitBytes)
    return {DeviceMemoryPath::Staged, "the call's largest buffer (" + std::to_string(callBytes) +
                                          " bytes) exceeds ROCE_PG_IB_DEVICE_REG_BYTES=" + std::to_string(limitBytes)};
  if (device.dmabuf && nicDmabuf)
    return {DeviceMemoryPath::Dmabuf, device.dmabufWhy + "; " + nicWhy + flushNote(device), device.exportDmabuf,
            device.flushNicWrites, device.bufferId};
  const std::string noDmabuf = "no dma-buf: " + (device.dmabuf ? nicWhy : device.dmabufWhy);
  if (device.pointer)
    return {DeviceMemoryPath::Pointer, noDmabuf + "; peer memory: " + device.pointerWhy + flushNote(device), nullptr,
            device.flushNicWrites, device.bufferId};
  return {DeviceMemoryPath::Staged, noDmabuf + "; no peer memory: " + device.pointerWhy};
}

}  // namespace roce::adapter
