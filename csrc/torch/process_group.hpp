// The c10d::ProcessGroup that roce_pg's creator returns when roce serves every
// device of a group. It differs from torch's own in its name: torch names
// every out-of-tree backend's group "custom" (ProcessGroup::getBackendName
// maps the backend type), and that name is what DDP's logging data reports as
// backend_name; and in its rank and size after a reconfigure, which are the
// new membership's (torch's own group keeps the ones it was created with).
// The RoceBackend is registered on it from Python exactly as torch registers
// a plugin backend.
#pragma once
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace roce::adapter {

class RoceProcessGroup : public c10d::ProcessGroup {
 public:
  RoceProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)
      : c10d::ProcessGroup(store, rank, size), currentRank_(rank), currentSize_(size) {}

  const std::string getBackendName() const override { return "roce"; }

#ifdef C10D_BACKEND_HAS_RECONFIGURE
  int getRank() const override { return currentRank_; }
  int getSize() const override { return currentSize_; }
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override {
    auto work = c10d::ProcessGroup::reconfigure(opts);
    const auto backend = getDefaultBackend();
    currentRank_ = backend->getRank();
    currentSize_ = backend->getSize();
    return work;
  }
#endif

 private:
  int currentRank_, currentSize_;
};

}  // namespace roce::adapter
