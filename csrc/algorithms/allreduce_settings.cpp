// The allreduce registry's names as the values of the settings that force an
// algorithm: ROCE_PG_ALGO_ALLREDUCE (and its older name ROCE_PG_ALGO) every
// entry, ROCE_PG_ALGO_ALLREDUCE_ACROSS the entries that run among machines.
#include "../common/setting_choices.hpp"
#include "allreduce_registry.hpp"

namespace roce::algorithms {
namespace {

const bool registered = [] {
  for (int i = 0; i < AllreduceAlgorithms::size; ++i) {
    const char* name = AllreduceAlgorithms::names[i];
    addSettingChoice("ROCE_PG_ALGO", name);
    addSettingChoice("ROCE_PG_ALGO_ALLREDUCE", name);
    if (AllreduceAlgorithms::amongMachines[i]) addSettingChoice("ROCE_PG_ALGO_ALLREDUCE_ACROSS", name);
  }
  return true;
}();

}  // namespace
}  // namespace roce::algorithms
