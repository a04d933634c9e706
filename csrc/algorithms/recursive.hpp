// Latency-optimal allreduce algorithms over a Team (see recursive.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "../common/dtype.hpp"
#include "allreduce_call.hpp"
#include "cost_model.hpp"
#include "select.hpp"
#include "team.hpp"

namespace roce::comm {
class Communicator;
}
namespace roce::algorithms {
using namespace roce::comm;


// Kernel-level (op is a kernel operator: no AVG/PREMUL_SUM), in place over
// `count` elements, among the members of `team`.
// Recursive doubling: ceil(lg p) rounds exchanging the whole vector.
void recursiveDoublingAllreduce(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count,
                                DataType t, ReduceOp op);
// Rabenseifner: reduce-scatter by recursive halving, allgather by recursive
// doubling: 2 lg p rounds moving 2(p-1)/p of the vector.
void rabenseifnerAllreduce(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count, DataType t,
                           ReduceOp op);

// Their entries in the allreduce registry (allreduce_registry.hpp). Both
// block between rounds, so hier's overlapped form cannot use them.
struct RecursiveDoubling {
  static constexpr Algo id = Algo::Rd;
  static constexpr const char* name = "rd";
  static constexpr bool amongMachines = true, pipelines = false;
  static double cost(const CostConstants& k, const Shape& s, double bytes, Algo) {
    return costRecursiveDoubling(k, s, bytes);
  }
  static void run(const AllreduceCall& a);
};
struct Rabenseifner {
  static constexpr Algo id = Algo::Rabenseifner;
  static constexpr const char* name = "rabenseifner";
  static constexpr bool amongMachines = true, pipelines = false;
  static double cost(const CostConstants& k, const Shape& s, double bytes, Algo) {
    return costRabenseifner(k, s, bytes);
  }
  static void run(const AllreduceCall& a);
};

}  // namespace roce::algorithms
