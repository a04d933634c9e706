// The c10d::ProcessGroup that roce_pg's creator returns when roce serves every
// device of a group. It differs from torch's own only in its name: torch names
// every out-of-tree backend's group "custom" (ProcessGroup::getBackendName
// maps the backend type), and that name is what DDP's logging data reports as
// backend_name. The RoceBackend is registered on it from Python exactly as
// torch registers a plugin backend.
#pragma once
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace roce::adapter {

class RoceProcessGroup : public c10d::ProcessGroup {
 public:
  RoceProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)
      : c10d::ProcessGroup(store, rank, size) {}

  const std::string getBackendName() const override { return "roce"; }
};

}  // namespace roce::adapter
