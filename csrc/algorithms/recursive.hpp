// Latency-optimal allreduce algorithms over a Team (see recursive.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "../common/dtype.hpp"
#include "team.hpp"

namespace roce {

class Communicator;

// Kernel-level (op is a kernel operator: no AVG/PREMUL_SUM), in place over
// `count` elements, among the members of `team`.
// Recursive doubling: ceil(lg p) rounds exchanging the whole vector.
void recursiveDoublingAllreduce(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count,
                                DataType t, ReduceOp op);
// Rabenseifner: reduce-scatter by recursive halving, allgather by recursive
// doubling: 2 lg p rounds moving 2(p-1)/p of the vector.
void rabenseifnerAllreduce(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count, DataType t,
                           ReduceOp op);

}  // namespace roce
