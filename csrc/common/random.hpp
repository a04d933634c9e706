// 64 random bits from the system's entropy source: the nonces that tell one
// group incarnation, shared segment or reconfigure handle from another.
#pragma once
#include <cstdint>
#include <random>

namespace roce {

inline uint64_t randomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace roce
