// The ports one verbs transport drives ("rails", issue 27: every NIC), and a
// buffer registered on each of them. A memory region belongs to one
// protection domain, so memory that queue pairs of several ports touch (the
// landing and staging pools, a peer's control rings) is registered once per
// rail; a queue pair on rail r uses lkey(r) and rkey(r). Each registration
// counts against the locked-memory limit on its own (the kernel charges every
// pin), so registered bytes are the buffer's size times the rails.
#pragma once
#include <infiniband/verbs.h>

#include <array>
#include <memory>
#include <vector>

#include "port_choice.hpp"

namespace roce {

class VerbsDevice;
using Rails = std::vector<std::shared_ptr<VerbsDevice>>;

class RailMrs {
 public:
  RailMrs() = default;
  ~RailMrs() { deregister(); }
  RailMrs(const RailMrs&) = delete;
  RailMrs& operator=(const RailMrs&) = delete;

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

}  // namespace roce
