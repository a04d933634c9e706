// Strict parsing of numbers that come from other processes (store values,
// wire messages): never trusted, never std::stoi (which accepts "12abc").
#pragma once
#include <cstdint>
#include <string>

namespace roce {

// Unsigned decimal without sign or spaces, in [lo, hi].
inline bool parseU64(const std::string& s, uint64_t lo, uint64_t hi, uint64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    const uint64_t d = static_cast<uint64_t>(ch - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  if (v < lo || v > hi) return false;
  out = v;
  return true;
}

}  // namespace roce
