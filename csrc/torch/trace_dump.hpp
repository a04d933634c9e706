// A group's flight recorder (engine/trace.hpp) in PyTorch's flight-recorder
// dump layout (version, pg_config, pg_status, entries; torch's
// FlightRecorder::dump_json, format "2.10"), so torch's tools read roce's
// trace: roce_pg.dump_trace() on request, and a file on a group's first
// failure when ROCE_PG_TRACE_DUMP names where.
//
// Differences from torch's own entries: no stack frames (recording them is
// what costs torch's hook its microseconds); sizes are element counts
// ([[n]]), not shapes; a failed operation reads "retired" without
// "completed" (torch's convention for one that never finished) and carries
// roce's reason in "error"; "algorithm", "peer", "tag" and "bytes" are
// roce's additions, and so is the top-level "roce_network": what the
// process refused of what reached it over the network (network_refusals.hpp),
// which the doctor's trace view prints.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "../engine/trace.hpp"
#include "network_refusals.hpp"

namespace roce::adapter {
using namespace roce::engine;

struct TraceDumpGroup {
  std::string name, desc;     // torch's group name (uid) and description
  std::vector<int64_t> ranks;  // global ranks of the group's members (empty: unknown)
  int rank = 0;                // this rank in the group
  NetworkRefusals network;     // the process's refusal counts when dumped
};

std::string traceDumpJson(const TraceRing& ring, const TraceDumpGroup& group);

// Writes traceDumpJson to `path` (a temporary file renamed into place, so a
// reader never sees half a dump); false, with the reason in *why, if it could not.
bool writeTraceDump(const std::string& path, const TraceRing& ring, const TraceDumpGroup& group, std::string* why);

}  // namespace roce::adapter
