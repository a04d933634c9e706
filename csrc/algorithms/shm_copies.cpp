// Allgather and broadcast for a group living entirely on one machine, straight
// through the node's shared-memory slots (shm_call.hpp has the chunk and
// barrier protocol they share with the allreduce):
//  * allgather, per chunk: every rank copies its block's chunk into its slot
//    (and into its own block of the output), one barrier, every rank copies
//    the peers' chunks out of their slots into their blocks;
//  * broadcast, per chunk: the root copies the chunk into its slot, one
//    barrier, every other rank copies it out.
// One copy in and one copy out per byte, against the point-to-point route's
// copy into a ring, a copy out of it and a wake-up per message; and every
// copy here is split by byte range over the rank's threads (ROCE_PG_WORKERS,
// on_workers.hpp), where the rings' copies run on the progress thread alone.
// The chunk (ROCE_PG_SHM_CHUNK_BYTES) keeps a slot in the cache between the
// rank that writes it and those that read it, as for the allreduce.
#include <algorithm>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "algorithms.hpp"
#include "on_workers.hpp"
#include "shm_call.hpp"

namespace roce::algorithms::detail {
using namespace roce::comm;

namespace {

size_t chunkOf(const Communicator& c, const NodeShm& shm) {
  return std::min(shm.slotBytes(), c.config().shm.chunkBytes);
}

bool overlaps(const char* a, const char* b, size_t n) { return a < b + n && b < a + n; }

}  // namespace

void shmAllgather(Communicator& c, const void* input, void* output, size_t blockBytes) {
  NodeShm& shm = *c.nodeShm();
  const int n = shm.localSize(), me = shm.localIndex();
  const std::vector<int>& ranks = c.topology().localRanks;  // slot j holds group rank ranks[j]'s block
  char* const out = static_cast<char*>(output);
  char* const own = out + static_cast<size_t>(c.rank()) * blockBytes;
  const char* src = static_cast<const char*>(input);
  if (src != own && overlaps(src, own, blockBytes)) {  // partly aliased: settle it before the chunks
    moveBytes(own, src, blockBytes);
    src = own;
  }
  const ShmCall call{ShmCollective::Allgather, blockBytes, {}, ReduceOp::Sum, 0, false, c.config().shm.chunkBytes};
  overSlots(
      c, shm, call, blockBytes, chunkOf(c, shm), std::min(blockBytes, chunkOf(c, shm)),
      [&](int buf, size_t off, size_t m) {
        char* slot = shm.slot(me, buf);
        onWorkers(c, m, 1, [&](size_t a, size_t b) {
          copyBytes(slot + a, src + off + a, b - a);
          if (src != own) copyBytes(own + off + a, src + off + a, b - a);  // while the line is cached
        });
      },
      [&](int buf, size_t off, size_t m) {
        onWorkers(c, (n - 1) * m, 1, [&](size_t from, size_t to) {
          eachPiece(n, me, m, from, to, [&](int j, size_t a, size_t b) {
            copyBytes(out + static_cast<size_t>(ranks[j]) * blockBytes + off + a, shm.slot(j, buf) + a, b - a);
          });
        });
        Counters::add(c.counters().bytesSentShm, m);
        Counters::add(c.counters().bytesCopied, static_cast<size_t>(n) * m);
      });
}

void shmBroadcast(Communicator& c, void* data, size_t bytes, int root) {
  NodeShm& shm = *c.nodeShm();
  const std::vector<int>& ranks = c.topology().localRanks;
  const int me = shm.localIndex();
  const int rootSlot = static_cast<int>(std::find(ranks.begin(), ranks.end(), root) - ranks.begin());
  char* const base = static_cast<char*>(data);
  const ShmCall call{ShmCollective::Broadcast, bytes, {}, ReduceOp::Sum, root, false, c.config().shm.chunkBytes};
  overSlots(
      c, shm, call, bytes, chunkOf(c, shm), me == rootSlot ? std::min(bytes, chunkOf(c, shm)) : 0,
      [&](int buf, size_t off, size_t m) {
        if (me != rootSlot) return;
        char* slot = shm.slot(me, buf);
        onWorkers(c, m, 1, [&](size_t a, size_t b) { copyBytes(slot + a, base + off + a, b - a); });
        Counters::add(c.counters().bytesSentShm, m);
        Counters::add(c.counters().bytesCopied, m);
      },
      [&](int buf, size_t off, size_t m) {
        if (me == rootSlot) return;
        const char* slot = shm.slot(rootSlot, buf);
        onWorkers(c, m, 1, [&](size_t a, size_t b) { copyBytes(base + off + a, slot + a, b - a); });
        Counters::add(c.counters().bytesCopied, m);
      });
}

}  // namespace roce::algorithms::detail
