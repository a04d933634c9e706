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
#include <bit>
#include <cstring>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "../common/error.hpp"
#include "../reduce/reduce.hpp"
#include "../transport/shm/node_shm.hpp"
#include "algorithms.hpp"
#include "on_workers.hpp"
#include "shm_barrier.hpp"

namespace roce::detail {
namespace {

// The call's descriptor as peers see it: dtype, op, which of the two
// protocols it runs and the two-step's chunk size (ranks that disagree on
// ROCE_PG_SHM_ONESHOT_MAX_BYTES or ROCE_PG_SHM_CHUNK_BYTES would otherwise
// read each other's slots wrongly).
constexpr uint32_t kOneShot = 1u << 16;
constexpr int kChunkShift = 17;  // log2 of the configured chunk (a power of two)
constexpr uint32_t kDataMask = 0xffff;
uint32_t describe(DataType t, Reduction red, bool oneShot, size_t chunkBytes) {
  return (static_cast<uint32_t>(t) << 8) | static_cast<uint32_t>(red.op) | (oneShot ? kOneShot : 0) |
         (static_cast<uint32_t>(std::countr_zero(chunkBytes)) << kChunkShift);
}
DataType dtypeOf(uint32_t kind) { return static_cast<DataType>((kind >> 8) & 0xff); }
ReduceOp opOf(uint32_t kind) { return static_cast<ReduceOp>(kind & 0xff); }
const char* protocolOf(uint32_t kind) { return kind & kOneShot ? "one-shot" : "two-step"; }
size_t chunkOf(uint32_t kind) { return size_t(1) << (kind >> kChunkShift); }

void checkSameCall(Communicator& c, NodeShm& shm, int buf, size_t count, uint32_t kind) {
  for (int j = 0; j < shm.localSize(); ++j) {
    uint64_t theirCount = shm.control(j)->opCount[buf].load(std::memory_order_relaxed);
    uint32_t theirKind = shm.control(j)->opKind[buf].load(std::memory_order_relaxed);
    if (theirCount != count || theirKind != kind) {
      // Every rank sees the same descriptors after the barrier, so every rank
      // raises here and the group stays consistent and usable.
      if (theirCount == count && (theirKind & kDataMask) == (kind & kDataMask) &&
          (theirKind & kOneShot) == (kind & kOneShot))
        throwInvalid(str("allreduce mismatch: rank ", c.rank(), " runs the shared-memory allreduce in chunks of ",
                         chunkOf(kind), " bytes but rank ", c.topology().localRanks[j], " in chunks of ",
                         chunkOf(theirKind), ". Set ROCE_PG_SHM_CHUNK_BYTES to the same value on every rank "
                         "(or leave it unset)"));
      if (theirCount == count && (theirKind & kDataMask) == (kind & kDataMask))
        throwInvalid(str("allreduce mismatch: rank ", c.rank(), " runs the ", protocolOf(kind),
                         " shared-memory allreduce for ", count, " elements but rank ", c.topology().localRanks[j],
                         " runs the ", protocolOf(theirKind), " one. Set ROCE_PG_SHM_ONESHOT_MAX_BYTES and "
                         "ROCE_PG_SHM_SLOT_BYTES to the same values on every rank"));
      throwInvalid(str("allreduce mismatch: rank ", c.rank(), " passed ", count, " elements of ",
                       dataTypeName(dtypeOf(kind)), " with ", reduceOpName(opOf(kind)), ", rank ",
                       c.topology().localRanks[j], " passed ", theirCount, " elements of ",
                       dataTypeName(dtypeOf(theirKind)), " with ", reduceOpName(opOf(theirKind)),
                       ". Every rank must pass tensors of the same size and dtype and the same op"));
    }
  }
}

// In the descriptor of the parity of the call's first chunk.
void announce(NodeShm& shm, int buf, size_t count, uint32_t kind) {
  ShmRankControl* mine = shm.control(shm.localIndex());
  // Relaxed: published by the barrier's release, read after its acquire.
  mine->opCount[buf].store(count, std::memory_order_relaxed);
  mine->opKind[buf].store(kind, std::memory_order_relaxed);
}

// Input pointers for a reduction; no allocation per call for usual sizes.
// Per thread (workers build their own), and two of them: the whole inputs
// (`which` 0) and those of one element range (1).
const void** inputsArray(int n, int which = 0) {
  thread_local std::vector<const void*> ins[2];
  if (ins[which].size() < static_cast<size_t>(n)) ins[which].resize(n);
  return ins[which].data();
}

// reduceMany over elements [lo, hi) of `out` and of every input.
void reduceRange(DataType t, ReduceOp op, char* out, const void* const* ins, int n, size_t lo, size_t hi,
                 size_t esz) {
  const void** part = inputsArray(n, 1);
  for (int j = 0; j < n; ++j) part[j] = static_cast<const char*>(ins[j]) + lo * esz;
  reduceMany(t, op, out + lo * esz, part, n, hi - lo);
}

void oneShotAllreduce(Communicator& c, NodeShm& shm, void* data, size_t count, DataType t, Reduction red) {
  const int n = shm.localSize(), me = shm.localIndex();
  const size_t bytes = count * elementSize(t);
  const uint32_t kind = describe(t, red, true, 1);  // one-shot has no chunks: ranks may differ in ROCE_PG_SHM_CHUNK_BYTES
  const int buf = static_cast<int>(c.shmIteration++ & 1);
  announce(shm, buf, count, kind);
  const size_t esz = elementSize(t);
  char* const out = static_cast<char*>(data);
  char* const mySlot = shm.slot(me, buf);
  onWorkers(c, count, esz, [&](size_t lo, size_t hi) {
    if (red.op == ReduceOp::PreMulSum) scaleCopy(t, mySlot + lo * esz, out + lo * esz, hi - lo, red.factor);
    else copyBytes(mySlot + lo * esz, out + lo * esz, (hi - lo) * esz);
  });
  shmBarrier(c, shm);
  checkSameCall(c, shm, buf, count, kind);
  const void** ins = inputsArray(n);
  for (int j = 0; j < n; ++j) ins[j] = shm.slot(j, buf);
  const ReduceOp op = kernelOp(red.op);
  onWorkers(c, count, esz, [&](size_t lo, size_t hi) {
    reduceRange(t, op, out, ins, n, lo, hi, esz);
    if (red.op == ReduceOp::Avg) divideBy(t, out + lo * esz, hi - lo, n);
  });
  // Published into the slot (what peers read) = copied once.
  Counters::add(c.counters().bytesSentShm, bytes);
  Counters::add(c.counters().bytesCopied, bytes);
}

}  // namespace

void shmAllreduce(Communicator& c, void* data, size_t count, DataType t, Reduction red) {
  NodeShm& shm = *c.nodeShm();
  const int n = shm.localSize(), me = shm.localIndex();
  const size_t esz = elementSize(t);
  const size_t chunkElems = std::min(shm.slotBytes(), c.config().shmChunkBytes) / esz;
  if (count * esz <= std::min(c.config().shmOneShotMaxBytes, shm.slotBytes()))
    return oneShotAllreduce(c, shm, data, count, t, red);
  const ReduceOp op = kernelOp(red.op);
  char* out = static_cast<char*>(data);
  const uint32_t kind = describe(t, red, false, c.config().shmChunkBytes);
  announce(shm, static_cast<int>(c.shmIteration & 1), count, kind);

  std::vector<const void*> ins(n);
  size_t off = 0;
  bool first = true;
  do {  // at least once, so even empty tensors check that the calls match
    const size_t m = std::min(chunkElems, count - off);
    const int buf = static_cast<int>(c.shmIteration++ & 1);
    char* mySlot = shm.slot(me, buf);
    char* chunk = out + off * esz;
    auto lo = [&](int j) { return m * j / n; };
    const size_t myLo = lo(me), myN = lo(me + 1) - myLo;
    // Calls f(j, a, b) for the part [a, b) of element range [from, to) of
    // the chunk that lies in slice j.
    auto eachSlice = [&](size_t from, size_t to, auto&& f) {
      for (int j = 0; j < n; ++j) {
        const size_t a = std::max(from, lo(j)), b = std::min(to, lo(j + 1));
        if (a < b) f(j, a, b);
      }
    };
    onWorkers(c, m, esz, [&](size_t from, size_t to) {
      eachSlice(from, to, [&](int j, size_t a, size_t b) {
        char* src = chunk + a * esz;
        if (red.op == ReduceOp::PreMulSum)  // own slice is scaled in place (it is overwritten anyway)
          scaleCopy(t, j == me ? src : mySlot + a * esz, src, b - a, red.factor);
        else if (j != me)
          copyBytes(mySlot + a * esz, src, (b - a) * esz);
      });
    });
    shmBarrier(c, shm);
    if (first) checkSameCall(c, shm, buf, count, kind);
    first = false;

    char* mine = chunk + myLo * esz;
    for (int j = 0; j < n; ++j) ins[j] = j == me ? mine : shm.slot(j, buf) + myLo * esz;
    if (myN) {
      onWorkers(c, myN, esz, [&](size_t a, size_t b) {
        reduceRange(t, op, mine, ins.data(), n, a, b, esz);
        if (red.op == ReduceOp::Avg) divideBy(t, mine + a * esz, b - a, n);
        copyBytes(mySlot + (myLo + a) * esz, mine + a * esz, (b - a) * esz);
      });
    }
    shmBarrier(c, shm);
    onWorkers(c, m, esz, [&](size_t from, size_t to) {
      eachSlice(from, to, [&](int j, size_t a, size_t b) {
        if (j != me) copyBytes(chunk + a * esz, shm.slot(j, buf) + a * esz, (b - a) * esz);
      });
    });
    // Into the slot: the others' slices and the reduced own slice (what peers
    // read); out of the slots: the others' reduced slices.
    Counters::add(c.counters().bytesSentShm, m * esz);
    Counters::add(c.counters().bytesCopied, (2 * m - myN) * esz);
    off += m;
  } while (off < count);
}

}  // namespace roce::detail
