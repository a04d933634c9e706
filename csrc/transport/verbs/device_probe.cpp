#include "device_probe.hpp"

#include <cstdint>
#include <infiniband/verbs.h>

namespace roce::transport::verbs {
namespace {

const char* portStateName(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    default: return "OTHER";
  }
}

int mtuBytes(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
  }
  return 0;
}

}  // namespace

std::vector<RdmaPortInfo> probeRdmaPorts() {
  std::vector<RdmaPortInfo> out;
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  if (!devs) return out;
  for (int i = 0; i < n; ++i) {
    ibv_context* ctx = ibv_open_device(devs[i]);
    if (!ctx) continue;
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) == 0) {
      for (int p = 1; p <= attr.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (ibv_query_port(ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
        out.push_back({ibv_get_device_name(devs[i]), p, portStateName(pa.state),
                       pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand",
                       mtuBytes(pa.active_mtu)});
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(devs);
  return out;
}

}  // namespace roce::transport::verbs
