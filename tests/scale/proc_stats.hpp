// What one rank costs the machine, read from /proc/self: memory (RSS, and PSS,
// which splits pages shared with other processes - the launcher's image after
// fork, shared-memory segments - fairly among them), the shared-memory segment
// it created (reserved in /dev/shm whether or not its pages were touched, so
// RSS and PSS miss what nobody wrote yet), descriptors, threads.
#pragma once
#include <cstdint>

namespace scale {

struct ProcStats {
  uint64_t rssKiB = 0;
  uint64_t pssKiB = 0;
  uint64_t peakRssKiB = 0;  // VmHWM: the most this process had resident so far
  uint64_t shmSegmentKiB = 0;  // its own roce shared-memory segment (the peers map it too)
  int fds = 0;
  int threads = 0;
};

ProcStats readProcStats();

}  // namespace scale
