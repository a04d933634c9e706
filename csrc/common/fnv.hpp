// FNV-1a, 64 bits: a fast hash that every process computes alike (no
// secret, no defence against chosen inputs: for names and digests that
// trusted parties write).
#pragma once
#include <cstdint>
#include <string_view>

namespace roce {

inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace roce
