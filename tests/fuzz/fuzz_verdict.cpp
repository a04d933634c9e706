// formatVerdict (csrc/liveness/verdict.hpp) on any snapshots, as a rank
// receives them from the others over the lifelines when a group hangs: the
// first byte picks the group size (1-64), the rest is split at NUL bytes
// into rank 0's, rank 1's, ... snapshot texts. It must not crash, and the
// same snapshots give the same text (every rank must print the same verdict).
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "liveness/verdict.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int ranks = 1 + data[0] % 64;
  std::map<int, std::string> states;
  std::string text;
  int rank = 0;
  for (size_t i = 1; i <= size && rank < ranks; ++i) {
    if (i == size || data[i] == 0) {
      if (!text.empty()) states[rank] = text;
      text.clear();
      ++rank;
    } else {
      text.push_back(static_cast<char>(data[i]));
    }
  }
  if (roce::liveness::formatVerdict(states, ranks) != roce::liveness::formatVerdict(states, ranks)) std::abort();
  return 0;
}
