#include "memory_plan.hpp"

#include <cstdio>
#include <fstream>

#include "options.hpp"

namespace scale {
namespace {

constexpr double kGiB = double(1u << 30);
constexpr int kBuffersPerSize = 3;

double availableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string name;
  double kib = 0;
  while (in >> name >> kib)
    if (name == "MemAvailable:") return kib * 1024;
    else in.ignore(256, '\n');
  return 0;
}

}  // namespace

std::vector<std::string> dropSizesThatDoNotFit(Options& o) {
  const double budget = o.memoryShare * availableBytes();
  std::vector<size_t> kept;
  std::vector<std::string> why;
  for (size_t s : o.sizes) {
    const double need = double(kBuffersPerSize) * double(s) * o.ranks;
    if (need <= budget) {
      kept.push_back(s);
      continue;
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "allreduce of %s not timed at %d ranks: %d x %s x %d ranks = %.1f GiB > %.0f%% of the %.1f GiB available",
                  bytesLabel(s).c_str(), o.ranks, kBuffersPerSize, bytesLabel(s).c_str(), o.ranks, need / kGiB,
                  o.memoryShare * 100, budget / o.memoryShare / kGiB);
    why.push_back(line);
  }
  o.sizes = kept;
  return why;
}

}  // namespace scale
