// The launcher's command line (roce_scale --help prints it).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace scale {

struct Options {
  std::vector<int> machines;  // ranks on each simulated machine, in rank order
  int ranks = 0;              // their sum
  // Which collectives are checked: None (only the timed allreduces' results),
  // Few (those whose peers stay few as the group grows), Full (all).
  enum class Checks { None, Few, Full } checks = Checks::Full;
  std::vector<std::string> allreduceAlgos{"rd", "rabenseifner", "ring", "tree", "hier", "auto"};
  std::vector<std::string> gatherAlgos{"ring", "bruck", "hier"};
  std::vector<size_t> sizes{8, size_t(1) << 20, size_t(32) << 20};  // timed allreduce sizes (bytes)
  int iterations = 0;         // most calls per timed size; 0: defaultIterations()
  int budgetS = 5;            // seconds each timed size may take, about
  int timeLimitS = 300;       // the whole run, wall clock
  double memoryShare = 0.5;   // of MemAvailable the timed buffers may take
  std::string jsonPath;       // per-rank results as JSON, if set

  // The simulated machine of `rank` (an index into machines).
  int machineOf(int rank) const;
};

// Exits with the usage text on a malformed command line.
Options parseOptions(int argc, char** argv);

// "8 B", "1 MiB", "32 MiB".
std::string bytesLabel(size_t bytes);

}  // namespace scale
