#include "shm_call.hpp"

#include <bit>
#include <cstdint>
#include <vector>

#include "../common/error.hpp"
#include "../reduce/reduce.hpp"

namespace roce::algorithms::detail {
using namespace roce::reduce;

namespace {

// The descriptor word: bits 0-15 the data (dtype << 8 | op; broadcast: the
// root), 16 one-shot, 17-22 log2 of the chunk, 23-25 the collective. The
// element count travels in its own 64-bit word.
constexpr uint32_t kDataMask = 0xffff;
constexpr uint32_t kOneShot = 1u << 16;
constexpr int kChunkShift = 17, kWhatShift = 23;
constexpr uint32_t kChunkMask = 0x3f;

uint32_t encode(const ShmCall& k) {
  const uint32_t data = k.what == ShmCollective::Broadcast
                            ? static_cast<uint32_t>(k.root)
                            : (static_cast<uint32_t>(k.dtype) << 8) | static_cast<uint32_t>(k.op);
  return (data & kDataMask) | (k.oneShot ? kOneShot : 0) |
         (static_cast<uint32_t>(std::countr_zero(k.chunkBytes)) << kChunkShift) |
         (static_cast<uint32_t>(k.what) << kWhatShift);
}

ShmCall decode(uint64_t count, uint32_t w) {
  ShmCall k;
  k.what = static_cast<ShmCollective>(w >> kWhatShift);
  k.count = count;
  if (k.what == ShmCollective::Broadcast) {
    k.root = static_cast<int>(w & kDataMask);
  } else {
    k.dtype = static_cast<DataType>((w >> 8) & 0xff);
    k.op = static_cast<ReduceOp>(w & 0xff);
  }
  k.oneShot = w & kOneShot;
  k.chunkBytes = size_t(1) << ((w >> kChunkShift) & kChunkMask);
  return k;
}

const char* nameOf(ShmCollective w) {
  switch (w) {
    case ShmCollective::Allreduce: return "allreduce";
    case ShmCollective::Allgather: return "allgather";
    case ShmCollective::Broadcast: return "broadcast";
    case ShmCollective::ReduceScatter: return "reduce_scatter";
    case ShmCollective::Barrier: return "barrier";
  }
  return "?";
}

// What a rank passed, in the words of its collective.
std::string argumentsOf(const ShmCall& k) {
  switch (k.what) {
    case ShmCollective::Allgather: return str(k.count, " bytes per rank");
    case ShmCollective::Broadcast: return str(k.count, " bytes from rank ", k.root);
    case ShmCollective::ReduceScatter:
      return str(k.count, " elements per rank of ", dataTypeName(k.dtype), " with ", reduceOpName(k.op));
    case ShmCollective::Barrier: return "no arguments";
    case ShmCollective::Allreduce: break;
  }
  return str(k.count, " elements of ", dataTypeName(k.dtype), " with ", reduceOpName(k.op));
}

[[noreturn]] void mismatch(Communicator& c, const ShmCall& mine, const ShmCall& theirs, int peer) {
  const char* what = nameOf(mine.what);
  const int me = c.rank();
  if (mine.what != theirs.what)
    throwInvalid(str("shared-memory collective mismatch: rank ", me, " runs ", what, " but rank ", peer, " runs ",
                     nameOf(theirs.what), ". Every rank must call the same collectives in the same order"));
  const bool sameArgs = mine.count == theirs.count && mine.dtype == theirs.dtype && mine.op == theirs.op &&
                        mine.root == theirs.root;
  if (sameArgs && mine.oneShot != theirs.oneShot)
    throwInvalid(str(what, " mismatch: rank ", me, " runs the ", mine.oneShot ? "one-shot" : "two-step",
                     " shared-memory ", what, " for ", mine.count, " elements but rank ", peer, " runs the ",
                     theirs.oneShot ? "one-shot" : "two-step", " one. Set ROCE_PG_SHM_ONESHOT_MAX_BYTES and "
                     "ROCE_PG_SHM_SLOT_BYTES to the same values on every rank"));
  if (sameArgs)
    throwInvalid(str(what, " mismatch: rank ", me, " runs the shared-memory ", what, " in chunks of ",
                     mine.chunkBytes, " bytes but rank ", peer, " in chunks of ", theirs.chunkBytes,
                     ". Set ROCE_PG_SHM_CHUNK_BYTES to the same value on every rank (or leave it unset)"));
  const char* rule = mine.what == ShmCollective::Broadcast ? "a tensor of the same size and the same source rank"
                     : mine.what == ShmCollective::Allgather ? "tensors of the same size"
                                                             : "tensors of the same size and dtype and the same op";
  throwInvalid(str(what, " mismatch: rank ", me, " passed ", argumentsOf(mine), ", rank ", peer, " passed ",
                   argumentsOf(theirs), ". Every rank must pass ", rule));
}

}  // namespace

void announceCall(NodeShm& shm, int buf, const ShmCall& call) {
  if (call.what == ShmCollective::Broadcast && static_cast<uint32_t>(call.root) > kDataMask)
    throwInvalid(str("broadcast: root ", call.root, " does not fit the shared-memory call descriptor"));
  ShmRankControl* mine = shm.control(shm.localIndex());
  // Relaxed: published by the barrier's release, read after its acquire.
  mine->opCount[buf].store(call.count, std::memory_order_relaxed);
  mine->opKind[buf].store(encode(call), std::memory_order_relaxed);
}

void checkSameCall(Communicator& c, NodeShm& shm, int buf, const ShmCall& call) {
  const uint32_t kind = encode(call);
  for (int j = 0; j < shm.localSize(); ++j) {
    const uint64_t theirCount = shm.control(j)->opCount[buf].load(std::memory_order_relaxed);
    const uint32_t theirKind = shm.control(j)->opKind[buf].load(std::memory_order_relaxed);
    if (theirCount != call.count || theirKind != kind)
      mismatch(c, decode(call.count, kind), decode(theirCount, theirKind), c.topology().localRanks[j]);
  }
}

const void** inputsArray(int n) {
  thread_local std::vector<const void*> ins;
  if (ins.size() < static_cast<size_t>(n)) ins.resize(n);
  return ins.data();
}

void reduceRange(DataType t, ReduceOp op, char* out, const void* const* ins, int n, size_t lo, size_t hi) {
  thread_local std::vector<const void*> part;  // not inputsArray's: the caller's `ins` may be that one
  if (part.size() < static_cast<size_t>(n)) part.resize(n);
  const size_t esz = elementSize(t);
  for (int j = 0; j < n; ++j) part[j] = static_cast<const char*>(ins[j]) + lo * esz;
  reduceMany(t, op, out + lo * esz, part.data(), n, hi - lo);
}

}  // namespace roce::algorithms::detail
