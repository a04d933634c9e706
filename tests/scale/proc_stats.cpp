#include "proc_stats.hpp"

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace scale {
namespace {

// The value of the "Name:   value kB" line of a /proc status-like file, or 0.
uint64_t field(const char* path, const std::string& name) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, name.size(), name) == 0 && line.size() > name.size() && line[name.size()] == ':')
      return std::stoull(line.substr(name.size() + 1));
  return 0;
}

// The mappings of the segments this process created: roce names them
// /roce_pg.<pid>.<random> (csrc/transport/shm/shm_segment.cpp).
uint64_t ownSegmentKiB() {
  std::ifstream in("/proc/self/maps");
  const std::string mine = "/roce_pg." + std::to_string(getpid()) + ".";
  uint64_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find(mine) == std::string::npos) continue;
    const size_t dash = line.find('-');
    bytes += std::stoull(line.substr(dash + 1), nullptr, 16) - std::stoull(line.substr(0, dash), nullptr, 16);
  }
  return bytes / 1024;
}

int openDescriptors() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

}  // namespace

ProcStats readProcStats() {
  ProcStats s;
  s.rssKiB = field("/proc/self/status", "VmRSS");
  s.peakRssKiB = field("/proc/self/status", "VmHWM");
  s.threads = static_cast<int>(field("/proc/self/status", "Threads"));
  s.pssKiB = field("/proc/self/smaps_rollup", "Pss");
  s.shmSegmentKiB = ownSegmentKiB();
  s.fds = openDescriptors();
  return s;
}

}  // namespace scale
