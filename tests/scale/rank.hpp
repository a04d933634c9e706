// One rank of the harness (a forked process): forms the groups, runs the
// checks and timings, and reports through the store.
#pragma once
#include <sys/types.h>

namespace scale {

struct Options;

// Returns the process's exit status: 0 when everything passed.
int rankMain(const Options& o, int rank, int storePort, pid_t launcher);

}  // namespace scale
