// Allreduce and the reductions built on the same pieces (reduce, reduce-scatter),
// plus allgather, which is the second half of the ring allreduce.
#include <cstring>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "../reduce/reduce.hpp"
#include "algorithms.hpp"
#include "ring.hpp"

namespace roce {

namespace detail {

void ringAllreduce(Communicator& c, void* data, size_t count, DataType t, Reduction red) {
  const uint64_t tag = c.nextCollectiveTag();
  if (red.op == ReduceOp::PreMulSum) scaleCopy(t, data, data, count, red.factor);
  const RingSegments segs = RingSegments::even(count, c.size());
  ringReduceScatter(c, tag, data, segs, t, kernelOp(red.op));
  ringAllgather(c, tag, data, segs, elementSize(t));
  if (red.op == ReduceOp::Avg) divideBy(t, data, count, c.size());
}

}  // namespace detail

void allreduce(Communicator& c, void* data, size_t count, DataType t, Reduction red) {
  checkSupported(red.op, t);
  if (c.size() == 1) {
    if (red.op == ReduceOp::PreMulSum) scaleCopy(t, data, data, count, red.factor);
    return;  // AVG over one rank is the identity
  }
  if (c.nodeShm()) detail::shmAllreduce(c, data, count, t, red);
  else detail::ringAllreduce(c, data, count, t, red);
}

void reduce(Communicator& c, void* data, size_t count, DataType t, Reduction red, int root) {
  // The root reduces in place; the others work on a copy so their input
  // tensor is left as it was (as with every other backend).
  void* work = data;
  if (c.rank() != root) {
    work = c.scratch(count * elementSize(t), 1);
    copyBytes(work, data, count * elementSize(t));
  }
  allreduce(c, work, count, t, red);
}

void reduceScatter(Communicator& c, const void* input, void* output, size_t blockCount, DataType t,
                   Reduction red) {
  checkSupported(red.op, t);
  const size_t esz = elementSize(t);
  const size_t total = blockCount * c.size();
  char* work = static_cast<char*>(c.scratch(total * esz, 1));
  if (red.op == ReduceOp::PreMulSum) scaleCopy(t, work, input, total, red.factor);
  else copyBytes(work, input, total * esz);
  const uint64_t tag = c.nextCollectiveTag();
  const auto segs = RingSegments::blocks(c.topology().ringOrder, blockCount);
  ringReduceScatter(c, tag, work, segs, t, kernelOp(red.op));
  char* mine = work + static_cast<size_t>(c.rank()) * blockCount * esz;
  if (red.op == ReduceOp::Avg) divideBy(t, mine, blockCount, c.size());
  copyBytes(output, mine, blockCount * esz);
}

void allgather(Communicator& c, const void* input, void* output, size_t blockBytes) {
  char* out = static_cast<char*>(output);
  char* mine = out + static_cast<size_t>(c.rank()) * blockBytes;
  if (mine != input) moveBytes(mine, input, blockBytes);
  const uint64_t tag = c.nextCollectiveTag();
  ringAllgather(c, tag, out, RingSegments::blocks(c.topology().ringOrder, blockBytes), 1);
}

}  // namespace roce
