// memcpy/memmove for buffers that may be empty: an empty tensor's data pointer
// can be null, and passing null to memcpy is undefined even for 0 bytes
// (UBSan reports it; optimisers may assume the pointer is non-null).
#pragma once
#include <cstddef>
#include <cstring>

namespace roce {

inline void copyBytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

inline void moveBytes(void* dst, const void* src, size_t n) {
  if (n) std::memmove(dst, src, n);
}

}  // namespace roce
