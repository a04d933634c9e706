// Allreduce for a group living entirely on one machine. Per chunk, with the
// chunk split into one slice per rank:
//   1. every rank copies the slices the *other* ranks will reduce into its own
//      shared slot (pre-scaled for PREMUL_SUM); its own slice stays in its tensor;
//   2. barrier;
//   3. rank i reduces slice i straight from its tensor and the peers' slots,
//      writing the result into its tensor and into its slot;
//   4. barrier;
//   5. every rank copies the other reduced slices from their owners' slots.
// That is ~4N bytes of loads and stores per rank for N bytes of input with two
// ranks; the allreduce is bound by memory bandwidth. What decides whether
// those bytes come from the cache or from DRAM is the chunk size
// (ROCE_PG_SHM_CHUNK_BYTES, by default half the per-core L2): a slot written
// in step 1 is read by the peers in step 3 while still cached, and the
// tensor lines read in step 1 are still cached when step 5 overwrites them
// (no second trip to DRAM for the stores). Measured on a 2-core EPYC with 1 MiB
// of L2 per core, 2 ranks, 32 MiB: 4 MiB chunks 4.9 GB/s, 2 MiB 5.5, 1 MiB and
// 512 KiB 10.5 (docs/PERFORMANCE.md). The DRAM traffic left is the tensor's
// own read and write, as for a plain copy.
// Slots are double-buffered, so step 1 of the next chunk needs no third barrier:
// passing the next chunk's first barrier proves everyone finished step 5 here.
//
// Small and medium sizes (up to ROCE_PG_SHM_ONESHOT_MAX_BYTES) go one-shot
// instead, as NCCL's LL or DeepSpeed's "symmetric naive" allreduce: every rank
// copies its input into its slot, one barrier, and every rank reduces all the
// slots into its tensor itself, in slot order, so every rank computes the same
// bits. One synchronisation instead of two per chunk, at n reads per element
// instead of ~2; double buffering again removes the trailing barrier (a rank
// reuses a slot only after the next op's barrier, which every peer reaches
// only once it stopped reading this op's slots).
//
// Every copy and reduction above is split over the rank's threads
// (ROCE_PG_WORKERS: the caller plus worker-pool threads, common/worker_pool.hpp)
// by element range. A range is computed exactly as the whole would be (the
// same inputs in the same slot order per element), so the bits do not depend
// on the worker count, and peers never see it.
#include <algorithm>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "../reduce/reduce.hpp"
#include "../transport/shm/node_shm.hpp"
#include "algorithms.hpp"
#include "on_workers.hpp"
#include "shm_barrier.hpp"
#include "shm_call.hpp"

namespace roce::algorithms::detail {
using namespace roce::comm;
using namespace roce::reduce;
using namespace roce::transport::shm;

namespace {

void oneShotAllreduce(Communicator& c, NodeShm& shm, void* data, size_t count, DataType t, Reduction red) {
  const int n = shm.localSize(), me = shm.localIndex();
  const size_t esz = elementSize(t);
  // One-shot has no chunks: ranks may differ in ROCE_PG_SHM_CHUNK_BYTES.
  const ShmCall call{ShmCollective::Allreduce, count, t, red.op, 0, true, 1};
  char* const out = static_cast<char*>(data);
  const ReduceOp op = kernelOp(red.op);
  overSlots(
      c, shm, call, count, count, count * esz,
      [&](int buf, size_t, size_t) {
        char* const mySlot = shm.slot(me, buf);
        onWorkers(c, count, esz, [&](size_t lo, size_t hi) {
          if (red.op == ReduceOp::PreMulSum) scaleCopy(t, mySlot + lo * esz, out + lo * esz, hi - lo, red.factor);
          else copyBytes(mySlot + lo * esz, out + lo * esz, (hi - lo) * esz);
        });
      },
      [&](int buf, size_t, size_t) {
        const void** ins = inputsArray(n);
        for (int j = 0; j < n; ++j) ins[j] = shm.slot(j, buf);
        onWorkers(c, count, esz, [&](size_t lo, size_t hi) {
          reduceRange(t, op, out, ins, n, lo, hi);
          if (red.op == ReduceOp::Avg) divideBy(t, out + lo * esz, hi - lo, n);
        });
      });
  // Published into the slot (what peers read) = copied once.
  Counters::add(c.counters().bytesSentShm, count * esz);
  Counters::add(c.counters().bytesCopied, count * esz);
}

}  // namespace

void shmAllreduce(Communicator& c, void* data, size_t count, DataType t, Reduction red) {
  NodeShm& shm = *c.nodeShm();
  const int n = shm.localSize(), me = shm.localIndex();
  const size_t esz = elementSize(t);
  const size_t chunkElems = std::min(shm.slotBytes(), c.config().shm.chunkBytes) / esz;
  if (count * esz <= std::min(c.config().shm.oneShotMaxBytes, shm.slotBytes()))
    return oneShotAllreduce(c, shm, data, count, t, red);
  const ReduceOp op = kernelOp(red.op);
  char* out = static_cast<char*>(data);
  const ShmCall call{ShmCollective::Allreduce, count, t, red.op, 0, false, c.config().shm.chunkBytes};
  // Slice j of a chunk of m elements: [lo(m, j), lo(m, j + 1)).
  auto lo = [n](size_t m, int j) { return m * j / n; };
  // Calls f(j, a, b) for the part [a, b) of element range [from, to) of a
  // chunk of m elements that lies in slice j.
  auto eachSlice = [&](size_t m, size_t from, size_t to, auto&& f) {
    for (int j = 0; j < n; ++j) {
      const size_t a = std::max(from, lo(m, j)), b = std::min(to, lo(m, j + 1));
      if (a < b) f(j, a, b);
    }
  };
  overSlots(
      c, shm, call, count, chunkElems, std::min(count, chunkElems) * esz,
      [&](int buf, size_t off, size_t m) {
        char* mySlot = shm.slot(me, buf);
        char* chunk = out + off * esz;
        onWorkers(c, m, esz, [&](size_t from, size_t to) {
          eachSlice(m, from, to, [&](int j, size_t a, size_t b) {
            char* src = chunk + a * esz;
            if (red.op == ReduceOp::PreMulSum)  // own slice is scaled in place (it is overwritten anyway)
              scaleCopy(t, j == me ? src : mySlot + a * esz, src, b - a, red.factor);
            else if (j != me)
              copyBytes(mySlot + a * esz, src, (b - a) * esz);
          });
        });
      },
      [&](int buf, size_t off, size_t m) {
        char* mySlot = shm.slot(me, buf);
        char* chunk = out + off * esz;
        const size_t myLo = lo(m, me), myN = lo(m, me + 1) - myLo;
        char* mine = chunk + myLo * esz;
        const void** ins = inputsArray(n);
        for (int j = 0; j < n; ++j) ins[j] = j == me ? mine : shm.slot(j, buf) + myLo * esz;
        if (myN) {
          onWorkers(c, myN, esz, [&](size_t a, size_t b) {
            reduceRange(t, op, mine, ins, n, a, b);
            if (red.op == ReduceOp::Avg) divideBy(t, mine + a * esz, b - a, n);
            copyBytes(mySlot + (myLo + a) * esz, mine + a * esz, (b - a) * esz);
          });
        }
        shmBarrier(c, shm);
        onWorkers(c, m, esz, [&](size_t from, size_t to) {
          eachSlice(m, from, to, [&](int j, size_t a, size_t b) {
            if (j != me) copyBytes(chunk + a * esz, shm.slot(j, buf) + a * esz, (b - a) * esz);
          });
        });
        // Into the slot: the others' slices and the reduced own slice (what peers
        // read); out of the slots: the others' reduced slices.
        Counters::add(c.counters().bytesSentShm, m * esz);
        Counters::add(c.counters().bytesCopied, (2 * m - myN) * esz);
      });
}

}  // namespace roce::algorithms::detail
