// The run's results: a table per metric over the ranks (min / median / max)
// on stdout, and every rank's values as JSON for scripts
// (tests/test_scale.py, benchmarks/scale.py).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "options.hpp"
#include "report.hpp"

namespace scale {

struct RunResult {
  std::vector<std::optional<RankReport>> reports;  // per rank; empty if it reported nothing
  std::vector<std::string> problems;               // why the run failed, one line each
  std::vector<std::string> notes;                  // what was left out, and why
  // The store's load over the whole run (group formations and the harness's
  // own few keys per rank: barriers, progress, reports).
  uint64_t storeRequests = 0, storeBytesIn = 0, storeBytesOut = 0;
  bool ok() const { return problems.empty(); }
};

void printSummary(const Options& o, const RunResult& r);
void writeJson(const Options& o, const RunResult& r, const std::string& path);

}  // namespace scale
