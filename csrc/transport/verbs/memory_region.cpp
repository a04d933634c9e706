#include "memory_region.hpp"

#include "verbs_device.hpp"

namespace roce::transport::verbs {

std::string describeRails(const Rails& rails) {
  std::string out;
  for (const auto& dev : rails) out += (out.empty() ? "" : " and ") + dev->describe();
  return out;
}

void MemoryRegion::registerOn(const Rails& rails, void* addr, size_t len, int access, const char* what) {
  deregister();
  len_ = len;
  try {
    for (const auto& dev : rails) {
      mrs_[count_] = dev->registerMemory(addr, len, access, what);
      ++count_;
    }
  } catch (...) {
    deregister();
    throw;
  }
}

void MemoryRegion::deregister() {
  for (int r = 0; r < count_; ++r)
    if (mrs_[r]) ibv_dereg_mr(mrs_[r]);
  mrs_ = {};
  count_ = 0;
}

}  // namespace roce::transport::verbs
