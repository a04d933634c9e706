// Lists the RDMA devices libibverbs can see, with their ports, for the init
// log (group/group_builder.cpp, ROCE_PG_DEBUG=INFO) and roce_pg.rdma_ports() (the
// doctor's --import row). The ports a rank drives are chosen elsewhere
// (chooseVerbsPorts, port_choice.hpp).
#pragma once
#include <string>
#include <vector>

namespace roce::transport::verbs {

struct RdmaPortInfo {
  std::string device;
  int port = 0;
  std::string state;       // "ACTIVE", "DOWN", ...
  std::string linkLayer;   // "Ethernet" (RoCE) or "InfiniBand"
  int activeMtu = 0;       // bytes
};

// Never throws: a machine without rdma-core devices yields an empty list.
std::vector<RdmaPortInfo> probeRdmaPorts();

}  // namespace roce::transport::verbs
