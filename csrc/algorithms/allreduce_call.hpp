// The arguments of one run of an allreduce algorithm (allreduce_registry.hpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "../common/dtype.hpp"
#include "team.hpp"

namespace roce::comm {
class Communicator;
}
namespace roce::algorithms {
using namespace roce::comm;


struct AllreduceCall {
  Communicator& c;
  const Team& team;    // the ranks that take part, in the algorithm's order
  uint64_t tag;        // the collective's tag
  void* data;          // in place, `count` elements of `t`
  size_t count;
  DataType t;
  ReduceOp op;         // a kernel operator: the caller applies AVG and PREMUL_SUM
  bool amongMachines;  // the team is hier's, one rank per machine (the model's shape differs)
};

}  // namespace roce::algorithms
