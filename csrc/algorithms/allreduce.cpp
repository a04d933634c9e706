// Allreduce and the reductions built on the same pieces (reduce, reduce-scatter),
// plus allgather, which is the second half of the ring allreduce. On one
// machine all three go through the shared-memory slots instead (shm_*.cpp).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "../common/error.hpp"
#include "../reduce/reduce.hpp"
#include "algorithms.hpp"
#include "allreduce_registry.hpp"
#include "recursive.hpp"
#include "ring.hpp"
#include "select.hpp"
#include "tree.hpp"

namespace roce::algorithms {
using namespace roce::comm;
using namespace roce::reduce;

namespace detail {

void ringAllreduce(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, size_t count,
                   DataType t, ReduceOp op) {
  const int n = static_cast<int>(order.size());
  const size_t esz = elementSize(t);
  const size_t unit = std::max<size_t>(1, 64 / esz), units = (count + unit - 1) / unit;
  const int channels = static_cast<int>(std::min<size_t>(channelsFor(c, count * esz), units));
  if (channels <= 1) return ringReduceScatterAllgather(c, order, tag, data, RingSegments::even(count, n), t, op);
  // Channels: independent rings over consecutive slices (cut at multiples of
  // 64 bytes, so with an aligned tensor no two threads write one cache line),
  // each with its own tag, scratch, queue pair and (beyond the first)
  // reducing helper thread, advanced together in one wait.
  std::deque<RingPass> passes;
  size_t begin = 0;
  for (int k = 0; k < channels; ++k) {
    const size_t end = std::min(count, (units * (k + 1) / channels) * unit);
    passes.emplace_back(c, order, channelTag(tag, k), static_cast<char*>(data) + begin * esz,
                        RingSegments::even(end - begin, n), t, op, true, true, k == 0 ? 0 : kScratchChannel + k - 1);
    passes.back().asChannel(k, k == 0 ? nullptr : &c.helper(k - 1));
    begin = end;
  }
  for (RingPass& p : passes) p.start();
  c.waitUntil(
      [&] {
        bool all = true;
        for (RingPass& p : passes) all &= p.advance();
        return all;
      },
      [&] { return str("ring neighbours of rank ", c.rank(), " in one of ", channels, " channels"); });
}

}  // namespace detail

void RingAllreduce::run(const AllreduceCall& a) {
  detail::ringAllreduce(a.c, a.team.ranks, a.tag, a.data, a.count, a.t, a.op);
}

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
  AllreduceAlgorithms::run(algo, {c, all, tag, data, count, t, op, false});
  if (red.op == ReduceOp::Avg) divideBy(t, data, count, c.size());
}

void reduce(Communicator& c, void* data, size_t count, DataType t, Reduction red, int root) {
  checkSupported(red.op, t);
  const size_t esz = elementSize(t);
  // The root reduces in place; the others work on a copy so their input
  // tensor is left as it was (as with every other backend).
  char* work = static_cast<char*>(data);
  if (c.rank() != root) {
    work = static_cast<char*>(c.scratch(count * esz, 1));
    copyBytes(work, data, count * esz);
  }
  if (chooseReduce(c, count * esz) != Algo::RsGather) return allreduce(c, work, count, t, red);
  // Reduce-scatter, then each rank sends its reduced segment to the root:
  // (p-1)/p n + n/p bytes per rank instead of the allreduce's 2(p-1)/p n.
  if (red.op == ReduceOp::PreMulSum) scaleCopy(t, work, work, count, red.factor);
  const uint64_t tag = c.nextCollectiveTag();
  const std::vector<int>& order = c.topology().ringOrder;
  const int n = c.size();
  const RingSegments segs = RingSegments::even(count, n);
  ringReduceScatter(c, order, tag, work, segs, t, kernelOp(red.op));
  const int pos = c.topology().ringIndexOf[c.rank()];
  auto segment = [&](int q) { return work + segs.offset[q] * esz; };
  if (red.op == ReduceOp::Avg) divideBy(t, segment(pos), segs.count[pos], n);
  if (c.rank() != root) {
    if (segs.count[pos]) c.wait(*c.post(Request::Kind::Send, root, tag, segment(pos), segs.count[pos] * esz));
    return;
  }
  std::vector<Request*> recvs;
  for (int q = 0; q < n; ++q)
    if (q != pos && segs.count[q])
      recvs.push_back(c.post(Request::Kind::Recv, order[q], tag, segment(q), segs.count[q] * esz));
  c.waitAll(recvs.data(), recvs.size());
}

void reduceScatter(Communicator& c, const void* input, void* output, size_t blockCount, DataType t,
                   Reduction red) {
  checkSupported(red.op, t);
  const size_t esz = elementSize(t), blockBytes = blockCount * esz;
  const int n = c.size();
  const size_t total = blockCount * n;
  const Algo algo = chooseReduceScatter(c, total * esz);
  if (algo == Algo::Shm) return detail::shmReduceScatter(c, input, output, blockCount, t, red);
  const bool hier = algo == Algo::Hier;
  // A working copy (the input is left as it was), pre-scaled for PREMUL_SUM;
  // hier wants the blocks shard-major.
  char* work = static_cast<char*>(c.scratch(total * esz, 1));
  const char* in = static_cast<const char*>(input);
  auto place = [&](int r) { return work + (hier ? detail::hierBlockIndex(c.topology(), r) : r) * blockBytes; };
  for (int r = 0; r < n; ++r) {
    if (red.op == ReduceOp::PreMulSum) scaleCopy(t, place(r), in + r * blockBytes, blockCount, red.factor);
    else copyBytes(place(r), in + r * blockBytes, blockBytes);
  }
  const uint64_t tag = c.nextCollectiveTag();
  char* mine;
  if (hier) {
    mine = detail::hierReduceScatter(c, tag, work, blockCount, t, kernelOp(red.op));
  } else {
    const auto segs = RingSegments::blocks(c.topology().ringOrder, blockCount);
    ringReduceScatter(c, c.topology().ringOrder, tag, work, segs, t, kernelOp(red.op));
    mine = work + static_cast<size_t>(c.rank()) * blockBytes;
  }
  if (red.op == ReduceOp::Avg) divideBy(t, mine, blockCount, n);
  copyBytes(output, mine, blockBytes);
}

void allgather(Communicator& c, const void* input, void* output, size_t blockBytes) {
  char* out = static_cast<char*>(output);
  char* mine = out + static_cast<size_t>(c.rank()) * blockBytes;
  const Algo algo = c.size() == 1 ? Algo::Ring : chooseAllgather(c, blockBytes * c.size());
  if (algo == Algo::Shm) return detail::shmAllgather(c, input, output, blockBytes);
  c.copyLocal(mine, input, blockBytes);
  const uint64_t tag = c.nextCollectiveTag();
  if (c.size() == 1) return;
  switch (algo) {
    case Algo::Bruck: return detail::bruckAllgather(c, tag, mine, out, blockBytes);
    case Algo::Hier: return detail::hierAllgather(c, tag, mine, out, blockBytes);
    default: break;
  }
  ringAllgather(c, c.topology().ringOrder, tag, out, RingSegments::blocks(c.topology().ringOrder, blockBytes), 1);
}

}  // namespace roce::algorithms
