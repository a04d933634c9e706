// Reduce-scatter for a group living entirely on one machine: the first half
// of the shared-memory allreduce (shm_allreduce.cpp), straight from the
// input's blocks. Per chunk of `per` elements of every block:
//   1. every rank copies chunk of block j, for every other rank j, into piece
//      j of its slot (pre-scaled for PREMUL_SUM, and then its own block too);
//   2. barrier;
//   3. every rank reduces its own block's chunk from its input and the peers'
//      slots, in slot order (as the allreduce does), into its output.
// One barrier per chunk: the slots are double-buffered (shm_call.hpp).
// Both copies and the reduction are split by element range over the rank's
// threads (ROCE_PG_WORKERS), each range computed as the whole would be, so
// the bits do not depend on the worker count.
#include <algorithm>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "../reduce/reduce.hpp"
#include "algorithms.hpp"
#include "on_workers.hpp"
#include "shm_call.hpp"

namespace roce::algorithms::detail {
using namespace roce::comm;
using namespace roce::reduce;

void shmReduceScatter(Communicator& c, const void* input, void* output, size_t blockCount, DataType t,
                      Reduction red) {
  NodeShm& shm = *c.nodeShm();
  const int n = shm.localSize(), me = shm.localIndex();
  const std::vector<int>& ranks = c.topology().localRanks;
  const size_t esz = elementSize(t), unit = std::max<size_t>(1, 64 / esz);
  // A slot holds one piece per rank; pieces of whole cache lines where they
  // can be, so no two threads write one line of a slot.
  size_t per = std::min(shm.slotBytes(), c.config().shm.chunkBytes) / esz / n;
  // The same on every rank (slot size, chunk, dtype, local ranks), so every
  // rank refuses alike, before any barrier.
  if (per == 0)
    throwInvalid(str("reduce_scatter through shared memory needs one ", dataTypeName(t), " element per local rank in a "
                     "slot: ", n, " ranks x ", esz, " bytes > ROCE_PG_SHM_SLOT_BYTES/ROCE_PG_SHM_CHUNK_BYTES (",
                     std::min(shm.slotBytes(), c.config().shm.chunkBytes), "); raise them, or set "
                     "ROCE_PG_ALGO_REDUCE_SCATTER=ring on every rank"));
  if (per > unit) per -= per % unit;
  const bool scaled = red.op == ReduceOp::PreMulSum;
  const int skip = scaled ? -1 : me;  // unscaled, the own block is read from the input
  const ReduceOp op = kernelOp(red.op);
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  auto block = [&](int j) { return in + static_cast<size_t>(ranks[j]) * blockCount * esz; };
  const ShmCall call{ShmCollective::ReduceScatter, blockCount, t, red.op, 0, false, c.config().shm.chunkBytes};
  overSlots(
      c, shm, call, blockCount, per, static_cast<size_t>(n) * std::min(blockCount, per) * esz,
      [&](int buf, size_t off, size_t m) {
        char* slot = shm.slot(me, buf);
        const int pieces = scaled ? n : n - 1;
        onWorkers(c, pieces * m, esz, [&](size_t from, size_t to) {
          eachPiece(n, skip, m, from, to, [&](int j, size_t a, size_t b) {
            char* dst = slot + (j * m + a) * esz;
            const char* src = block(j) + (off + a) * esz;
            if (scaled) scaleCopy(t, dst, src, b - a, red.factor);
            else copyBytes(dst, src, (b - a) * esz);
          });
        });
        Counters::add(c.counters().bytesSentShm, pieces * m * esz);
        Counters::add(c.counters().bytesCopied, pieces * m * esz);
      },
      [&](int buf, size_t off, size_t m) {
        const void** ins = inputsArray(n);
        for (int j = 0; j < n; ++j)
          ins[j] = j == skip ? block(me) + off * esz : shm.slot(j, buf) + me * m * esz;
        char* dst = out + off * esz;
        onWorkers(c, m, esz, [&](size_t a, size_t b) {
          reduceRange(t, op, dst, ins, n, a, b);
          if (red.op == ReduceOp::Avg) divideBy(t, dst + a * esz, b - a, n);
        });
      });
}

}  // namespace roce::algorithms::detail
