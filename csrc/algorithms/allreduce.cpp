// Allreduce and the reductions built on the same pieces (reduce, reduce-scatter),
// plus allgather, which is the second half of the ring allreduce.
#include <cstring>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "../reduce/reduce.hpp"
#include "algorithms.hpp"
#include "recursive.hpp"
#include "ring.hpp"
#include "select.hpp"

namespace roce {

namespace detail {

void ringAllreduce(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, size_t count,
                   DataType t, ReduceOp op) {
  const RingSegments segs = RingSegments::even(count, static_cast<int>(order.size()));
  ringReduceScatter(c, order, tag, data, segs, t, op);
  ringAllgather(c, order, tag, data, segs, elementSize(t));
}

}  // namespace detail

void allreduce(Communicator& c, void* data, size_t count, DataType t, Reduction red) {
  checkSupported(red.op, t);
  if (c.size() == 1) {
    if (red.op == ReduceOp::PreMulSum) scaleCopy(t, data, data, count, red.factor);
    return;  // AVG over one rank is the identity
  }
  const Algo algo = chooseAllreduce(c, count * elementSize(t));
  if (algo == Algo::Shm) return detail::shmAllreduce(c, data, count, t, red);
  // The network algorithms reduce with kernel operators: PREMUL_SUM scales
  // the input first, AVG divides the sum (see docs/ARCHITECTURE.md, Kernels).
  const uint64_t tag = c.nextCollectiveTag();
  if (red.op == ReduceOp::PreMulSum) scaleCopy(t, data, data, count, red.factor);
  const ReduceOp op = kernelOp(red.op);
  // Node-sorted order: ring edges and the low XOR partners stay on one machine.
  const Team all(c.topology().ringOrder, c.rank());
  switch (algo) {
    case Algo::Rd: recursiveDoublingAllreduce(c, all, tag, data, count, t, op); break;
    case Algo::Rabenseifner: rabenseifnerAllreduce(c, all, tag, data, count, t, op); break;
    case Algo::Hier: detail::hierAllreduce(c, tag, data, count, t, op); break;
    default: detail::ringAllreduce(c, all.ranks, tag, data, count, t, op); break;
  }
  if (red.op == ReduceOp::Avg) divideBy(t, data, count, c.size());
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
  ringReduceScatter(c, c.topology().ringOrder, tag, work, segs, t, kernelOp(red.op));
  char* mine = work + static_cast<size_t>(c.rank()) * blockCount * esz;
  if (red.op == ReduceOp::Avg) divideBy(t, mine, blockCount, c.size());
  copyBytes(output, mine, blockCount * esz);
}

void allgather(Communicator& c, const void* input, void* output, size_t blockBytes) {
  char* out = static_cast<char*>(output);
  char* mine = out + static_cast<size_t>(c.rank()) * blockBytes;
  if (mine != input) moveBytes(mine, input, blockBytes);
  const uint64_t tag = c.nextCollectiveTag();
  if (c.size() == 1) return;
  if (chooseAllgather(c, blockBytes * c.size()) == Algo::Bruck)
    return detail::bruckAllgather(c, tag, out + static_cast<size_t>(c.rank()) * blockBytes, out, blockBytes);
  ringAllgather(c, c.topology().ringOrder, tag, out, RingSegments::blocks(c.topology().ringOrder, blockBytes), 1);
}

}  // namespace roce
