// What this process refused or dropped of what reached it over the network
// (strangers, forged records, budgets exceeded), as named counts. One list
// for roce_pg.counters() and for the trace dump, which the doctor's trace
// view reads: the doctor runs in a process of its own and has no runtime to
// ask. The counts are the process's, shared by its groups, and never reset.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace roce::adapter {

using NetworkRefusals = std::vector<std::pair<const char*, uint64_t>>;

NetworkRefusals networkRefusals();

}  // namespace roce::adapter
