// Allreduce for a group living entirely on one machine. Per chunk, with the
// chunk split into one slice per rank:
//   1. every rank copies the slices the *other* ranks will reduce into its own
//      shared slot (pre-scaled for PREMUL_SUM); its own slice stays in its tensor;
//   2. barrier;
//   3. rank i reduces slice i straight from its tensor and the peers' slots,
//      writing the result into its tensor and into its slot;
//   4. barrier;
//   5. every rank copies the other reduced slices from their owners' slots.
// Memory traffic per rank is ~4N bytes for N bytes of input with two ranks
// (copying the own slice through the slot as well would be ~5.5N); the
// allreduce is bound by memory bandwidth, so this is what sets its speed.
// Slots are double-buffered, so step 1 of the next chunk needs no third barrier:
// passing the next chunk's first barrier proves everyone finished step 5 here.
#include <cstring>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "../common/error.hpp"
#include "../reduce/reduce.hpp"
#include "../transport/shm/node_shm.hpp"
#include "algorithms.hpp"

namespace roce::detail {
namespace {

void shmBarrier(Communicator& c, NodeShm& shm) {
  const uint64_t gen = ++c.shmBarrierGeneration;
  const int n = shm.localSize();
  shm.control(shm.localIndex())->arrived.store(gen, std::memory_order_release);
  auto lagging = [&]() -> int {
    for (int j = 0; j < n; ++j)
      if (shm.control(j)->arrived.load(std::memory_order_acquire) < gen) return j;
    return -1;
  };
  c.waitUntil([&] { return lagging() < 0; },
              [&] { return str("rank ", c.topology().localRanks[lagging()], " (shared-memory barrier)"); });
}

uint32_t describe(DataType t, Reduction red) {
  return (static_cast<uint32_t>(t) << 8) | static_cast<uint32_t>(red.op);
}

void checkSameCall(Communicator& c, NodeShm& shm, size_t count, uint32_t kind) {
  for (int j = 0; j < shm.localSize(); ++j) {
    uint64_t theirCount = shm.control(j)->opCount.load(std::memory_order_relaxed);
    uint32_t theirKind = shm.control(j)->opKind.load(std::memory_order_relaxed);
    if (theirCount != count || theirKind != kind) {
      // Every rank sees the same descriptors after the barrier, so every rank
      // raises here and the group stays consistent and usable.
      DataType td = static_cast<DataType>(theirKind >> 8);
      ReduceOp to = static_cast<ReduceOp>(theirKind & 0xff);
      throwInvalid(str("allreduce mismatch: rank ", c.rank(), " passed ", count, " elements of ",
                       dataTypeName(static_cast<DataType>(kind >> 8)), " with ",
                       reduceOpName(static_cast<ReduceOp>(kind & 0xff)), ", rank ",
                       c.topology().localRanks[j], " passed ", theirCount, " elements of ",
                       dataTypeName(td), " with ", reduceOpName(to),
                       ". Every rank must pass tensors of the same size and dtype and the same op"));
    }
  }
}

}  // namespace

void shmAllreduce(Communicator& c, void* data, size_t count, DataType t, Reduction red) {
  NodeShm& shm = *c.nodeShm();
  const int n = shm.localSize(), me = shm.localIndex();
  const size_t esz = elementSize(t);
  const size_t slotElems = shm.slotBytes() / esz;
  const ReduceOp op = kernelOp(red.op);
  char* out = static_cast<char*>(data);
  const uint32_t kind = describe(t, red);
  ShmRankControl* mine = shm.control(me);
  mine->opCount.store(count, std::memory_order_relaxed);
  mine->opKind.store(kind, std::memory_order_relaxed);

  std::vector<const void*> ins(n);
  size_t off = 0;
  bool first = true;
  do {  // at least once, so even empty tensors check that the calls match
    const size_t m = std::min(slotElems, count - off);
    const int buf = static_cast<int>(c.shmIteration++ & 1);
    char* mySlot = shm.slot(me, buf);
    char* chunk = out + off * esz;
    auto lo = [&](int j) { return m * j / n; };
    auto bytesOf = [&](int j) { return (lo(j + 1) - lo(j)) * esz; };
    const size_t myLo = lo(me), myN = lo(me + 1) - myLo;
    for (int j = 0; j < n; ++j) {
      char* src = chunk + lo(j) * esz;
      if (red.op == ReduceOp::PreMulSum)  // own slice is scaled in place (it is overwritten anyway)
        scaleCopy(t, j == me ? src : mySlot + lo(j) * esz, src, lo(j + 1) - lo(j), red.factor);
      else if (j != me)
        copyBytes(mySlot + lo(j) * esz, src, bytesOf(j));
    }
    shmBarrier(c, shm);
    if (first) checkSameCall(c, shm, count, kind);
    first = false;

    char* mine = chunk + myLo * esz;
    for (int j = 0; j < n; ++j) ins[j] = j == me ? mine : shm.slot(j, buf) + myLo * esz;
    if (myN) {
      reduceMany(t, op, mine, ins.data(), n, myN);
      if (red.op == ReduceOp::Avg) divideBy(t, mine, myN, n);
      copyBytes(mySlot + myLo * esz, mine, myN * esz);
    }
    shmBarrier(c, shm);
    for (int j = 0; j < n; ++j)
      if (j != me) copyBytes(chunk + lo(j) * esz, shm.slot(j, buf) + lo(j) * esz, bytesOf(j));
    // Into the slot: the others' slices and the reduced own slice (what peers
    // read); out of the slots: the others' reduced slices.
    Counters::add(c.counters().bytesSentShm, m * esz);
    Counters::add(c.counters().bytesCopied, (2 * m - myN) * esz);
    off += m;
  } while (off < count);
}

}  // namespace roce::detail
