// Lists the RDMA devices libibverbs can see, with their ports. The verbs
// transport (next milestone) chooses its device from this; today it feeds the
// init log and roce_pg.rdma_devices().
#pragma once
#include <string>
#include <vector>

namespace roce {

struct RdmaPortInfo {
  std::string device;
  int port = 0;
  std::string state;       // "ACTIVE", "DOWN", ...
  std::string linkLayer;   // "Ethernet" (RoCE) or "InfiniBand"
  int activeMtu = 0;       // bytes
};

// Never throws: a machine without rdma-core devices yields an empty list.
std::vector<RdmaPortInfo> probeRdmaPorts();

}  // namespace roce
