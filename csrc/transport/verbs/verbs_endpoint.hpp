// What a rank tells a peer about its end of a verbs connection, over the TCP
// side channel the ConnectionManager made for them: its queue pairs, address
// (GID/LID, MTU), where the peer may write (the landing pool: base, rkey, slot
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
  std::vector<uint32_t> qpns;
  uint32_t psn = 0;
  uint32_t lid = 0;
  ibv_gid gid{};
  int mtu = 0;
  uint64_t landing = 0;  // the landing pool's base address
  uint32_t rkey = 0;
  uint32_t slots = 0;    // landing slots in the pool
  uint64_t slotBytes = 0, stride = 0;
  uint32_t ctrlRecvs = 0;         // control messages it can take before returning credits
  std::vector<uint32_t> grants;   // landing slots the peer may write from the start

  std::string encode() const;
  // Throws (naming `peer`) on anything malformed or inconsistent with this side.
  static Endpoint parse(const std::string& text, int peer, int expectQps, int self);
};

}  // namespace roce::verbs
