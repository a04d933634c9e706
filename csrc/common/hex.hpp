// 64-bit values as lower-case hex text: the shortest form (group incarnations
// in store keys) and the fixed 16-digit form (reconfigure handles, the job
// secret: a parser can then insist on exactly the form that was written).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace roce {

inline std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%llx", static_cast<unsigned long long>(v));
  return buf;
}

inline std::string hex64Padded(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace roce
