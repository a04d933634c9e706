// Values of a ROCE_PG_* choice setting that a layer above common/ defines:
// the names of the allreduce algorithms come from their registry
// (csrc/algorithms/allreduce_registry.hpp), which adds them here while the
// library loads, before any configuration is read. Config::read() accepts
// them after its fixed values ("auto"), so a new algorithm is a valid setting
// without an edit here.
#pragma once
#include <vector>

namespace roce {

// Adds `value` (a string with static storage) to the values `setting` accepts.
void addSettingChoice(const char* setting, const char* value);
// `fixed`, then the values added for `setting`, in the order they were added.
std::vector<const char*> settingChoices(const char* setting, std::vector<const char*> fixed);

}  // namespace roce
