// What a rank tells a peer about its end of a verbs connection, over the TCP
// side channel the ConnectionManager made for them: its rails (per port:
// GID/LID and MTU), its queue pairs and the rail each is on, the slot
// geometry, and the landing slots it grants the peer to begin with (id,
// address, rkey per rail: the process's landing pool, landing_pool.hpp). Every
// field of a peer's endpoint is checked before it configures a queue pair or
// addresses memory.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "port_choice.hpp"

namespace roce::transport::verbs {

struct Endpoint {
  struct Rail {
    uint32_t lid = 0;
    ibv_gid gid{};
    int mtu = 0;
  };
  struct Qp {
    uint32_t qpn = 0;
    uint32_t rail = 0;  // index into rails
  };
  std::vector<Rail> rails;
  std::vector<Qp> qps;
  uint32_t psn = 0;
  uint64_t slotBytes = 0, stride = 0;
  uint32_t ctrlRecvs = 0;  // control messages it can take before returning credits
  struct Grant {
    uint32_t id = 0;  // the immediate to write with
    uint64_t addr = 0;
    uint32_t rkey[kMaxRails] = {};  // per rail, as rails
  };
  std::vector<Grant> grants;  // landing slots the peer may write from the start

  std::string encode() const;
  // Throws (naming `peer`) on anything malformed or inconsistent with this side.
  static Endpoint parse(const std::string& text, int peer, int expectQps, int self);
};

}  // namespace roce::transport::verbs
