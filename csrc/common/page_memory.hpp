// Whole pages straight from the kernel for buffers that verbs registers.
//
// Not malloc/aligned_alloc: glibc raises its mmap threshold each time a large
// mmapped block is freed, so after one group's pools are freed the next
// group's come from a heap arena, and RSS steps up by a pool's size each
// time the arena fragments (+4 MiB twice in 50 group cycles of the
// Soft-RoCE suite). Pages of their own also keep registered memory off pages
// that heap objects share (what ibv_fork_init's madvise needs).
#pragma once
#include <sys/mman.h>

#include <cstddef>

namespace roce {

inline size_t pageRound(size_t bytes) { return (bytes + 4095) & ~size_t(4095); }

// Zero-filled, page-aligned; nullptr when the kernel refuses.
inline char* mapPages(size_t bytes) {
  void* p = mmap(nullptr, pageRound(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

// `bytes`: what was passed to mapPages.
inline void unmapPages(char* p, size_t bytes) {
  if (p) munmap(p, pageRound(bytes));
}

}  // namespace roce
