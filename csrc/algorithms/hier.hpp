// The hierarchical allreduce's entry in the allreduce registry
// (allreduce_registry.hpp; the algorithm is in hier.cpp): a reduce-scatter
// inside each machine, an allreduce of each shard among the machines (its own
// choice from the registry's entries that run among machines), an allgather
// inside each machine.
#pragma once
#include "allreduce_call.hpp"
#include "cost_model.hpp"
#include "select.hpp"

namespace roce::algorithms {

struct HierAllreduce {
  static constexpr Algo id = Algo::Hier;
  static constexpr const char* name = "hier";
  static constexpr bool amongMachines = false, pipelines = false;
  // NaN unless every machine holds the same number (> 1) of the group's ranks.
  static double cost(const CostConstants& k, const Shape& s, double bytes, Algo across) {
    return costHier(k, s, bytes, across);
  }
  static void run(const AllreduceCall& a);  // the whole group (a.team is not used)
};

}  // namespace roce::algorithms
