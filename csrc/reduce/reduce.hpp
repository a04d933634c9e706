// Element-wise reduction kernels over contiguous buffers. AVG and PREMUL_SUM are
// not operators here: callers reduce with SUM, pre-scale with scaleCopy and
// finish with divideBy (as algorithms/allreduce.cpp and shm_allreduce.cpp do).
#pragma once
#include <cstddef>

#include "../common/dtype.hpp"

namespace roce::reduce {

// out[i] = ins[0][i] op ins[1][i] op ... op ins[nin-1][i]. `out` may alias ins[0].
// float16/bfloat16 accumulate in float32 and round once at the end.
// Integer SUM/PRODUCT wrap around like the tensor's own arithmetic.
void reduceMany(DataType t, ReduceOp op, void* out, const void* const* ins, int nin, size_t n);

// acc[i] = acc[i] op in[i]
void reduceInto(DataType t, ReduceOp op, void* acc, const void* in, size_t n);

// out[i] = in[i] * factor (PREMUL_SUM's scaling). Integers truncate toward zero.
void scaleCopy(DataType t, void* out, const void* in, size_t n, double factor);

// x[i] = x[i] / divisor (AVG's final step). Integers truncate toward zero.
void divideBy(DataType t, void* x, size_t n, int divisor);

// SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR: the operator the kernels apply for `op`.
ReduceOp kernelOp(ReduceOp op);

}  // namespace roce::reduce
