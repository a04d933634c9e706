// A memory region: one buffer registered on every port the transport drives
// ("rails": a rank may drive several ports, port_choice.hpp). An ibv_mr
// belongs to one protection domain, so memory that queue pairs of several
// ports touch (the landing and staging
// pools, a pair's control rings) is registered once per rail; a queue pair on
// rail r uses lkey(r) and rkey(r). (User buffers: RegCache, same rule.) Each registration
// counts against the locked-memory limit on its own (the kernel charges every
// pin), so registered bytes are the buffer's size times the rails.
#pragma once
#include <cstdint>
#include <infiniband/verbs.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "port_choice.hpp"

namespace roce::transport::verbs {

class VerbsDevice;
using Rails = std::vector<std::shared_ptr<VerbsDevice>>;

// "rxe0 port 1, ... and rxe1 port 1, ..." for messages.
std::string describeRails(const Rails& rails);

class MemoryRegion {
 public:
  MemoryRegion() = default;
  ~MemoryRegion() { deregister(); }
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  // Registers [addr, addr + len) on every rail; throws with the memlock
  // remedy (VerbsDevice::registerMemory), having deregistered what was done.
  void registerOn(const Rails& rails, void* addr, size_t len, int access, const char* what);
  void deregister();
  bool registered() const { return count_ > 0; }
  uint32_t lkey(int rail) const { return mrs_[rail]->lkey; }
  uint32_t rkey(int rail) const { return mrs_[rail]->rkey; }
  size_t bytes() const { return len_ * static_cast<size_t>(count_); }  // pinned, summed over rails

 private:
  std::array<ibv_mr*, kMaxRails> mrs_{};
  int count_ = 0;
  size_t len_ = 0;
};

}  // namespace roce::transport::verbs
