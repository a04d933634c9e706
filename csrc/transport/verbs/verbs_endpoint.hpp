// What a rank tells a peer about its end of a verbs connection, over the TCP
// side channel the ConnectionManager made for them: its rails (per port:
// GID/LID, MTU and the landing pool's rkey there), its queue pairs and the
// rail each is on, where the peer may write (the landing pool: base, slot
// geometry) and which landing slots it grants the peer to begin with. Every
// field of a peer's endpoint is checked before it configures a queue pair or
// addresses memory.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

namespace roce::verbs {

struct Endpoint {
  struct Rail {
    uint32_t lid = 0;
    ibv_gid gid{};
    int mtu = 0;
    uint32_t landingRkey = 0;  // the landing pool's rkey on this port
  };
  struct Qp {
    uint32_t qpn = 0;
    uint32_t rail = 0;  // index into rails
  };
  std::vector<Rail> rails;
  std::vector<Qp> qps;
  uint32_t psn = 0;
  uint64_t landing = 0;  // the landing pool's base address
  uint32_t slots = 0;    // landing slots in the pool
  uint64_t slotBytes = 0, stride = 0;
  uint32_t ctrlRecvs = 0;         // control messages it can take before returning credits
  std::vector<uint32_t> grants;   // landing slots the peer may write from the start

  std::string encode() const;
  // Throws (naming `peer`) on anything malformed or inconsistent with this side.
  static Endpoint parse(const std::string& text, int peer, int expectQps, int self);
};

}  // namespace roce::verbs
