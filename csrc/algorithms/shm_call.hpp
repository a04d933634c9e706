// What the shared-memory collectives (shm_allreduce.cpp, shm_copies.cpp,
// shm_reduce_scatter.cpp) have in common: the call descriptor every rank
// announces in its control block and checks against its peers' after the
// first barrier, and the chunk loop over the double-buffered slots.
//
// The slot protocol, per chunk: every rank writes its part into its slot of
// the chunk's parity, one barrier, every rank reads what it needs from the
// peers' slots (the allreduce's two-step adds a second barrier inside). Two
// parities, so writing the next chunk needs no trailing barrier: a rank
// writes a slot again only two chunks later, past a barrier that every peer
// reaches only once it stopped reading that slot. The same holds from one call
// to the next, whatever the collectives, because every call counts its
// chunks in the one AlgorithmState::shmIteration.
//
// The descriptors are per parity too: a fast peer may announce its next call
// (other parity) while a slow rank still checks this one.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../comm/communicator.hpp"
#include "../common/dtype.hpp"
#include "../transport/shm/node_shm.hpp"
#include "shm_barrier.hpp"

namespace roce::algorithms::detail {
using namespace roce::comm;
using namespace roce::transport::shm;

enum class ShmCollective : uint8_t { Allreduce, Allgather, Broadcast, ReduceScatter, Barrier };

// Everything about a call that ranks must agree on to read each other's slots
// right. `count` is elements (bytes for allgather and broadcast, which never
// look at values); `chunkBytes` a power of two.
struct ShmCall {
  ShmCollective what;
  uint64_t count = 0;
  DataType dtype = DataType{};
  ReduceOp op = ReduceOp::Sum;
  int root = 0;          // broadcast
  bool oneShot = false;  // allreduce
  size_t chunkBytes = 1;
};

// Publishes `call` in this rank's descriptor of parity `buf` (the parity of
// the call's first chunk); the barrier after it releases it.
void announceCall(NodeShm& shm, int buf, const ShmCall& call);
// After the first barrier: throws, on every rank alike (all see the same
// descriptors), if any local rank announced another call; nothing has been
// read from a peer's slot yet, so the group stays usable.
void checkSameCall(Communicator& c, NodeShm& shm, int buf, const ShmCall& call);

// Runs `call` over [0, count) elements in chunks of at most `chunk` (at least
// one, so even an empty call checks that the calls match): for each,
// publish(buf, off, m) writes this rank's part into its slot `buf`, then the
// barrier (the first one also checks the call), then consume(buf, off, m).
// `slotUse` is the most bytes one chunk writes into this rank's slot: they
// are allocated first (NodeShm::prepareOwnSlots), and a full /dev/shm fails
// the call here, before any barrier; the error breaks the group, which
// releases the peers waiting at the barrier.
template <class Publish, class Consume>
void overSlots(Communicator& c, NodeShm& shm, const ShmCall& call, size_t count, size_t chunk, size_t slotUse,
               Publish&& publish, Consume&& consume) {
  shm.prepareOwnSlots(slotUse);
  announceCall(shm, static_cast<int>(c.algorithmState().shmIteration & 1), call);
  chunk = std::max<size_t>(chunk, 1);
  size_t off = 0;
  bool first = true;
  do {
    const size_t m = std::min(chunk, count - off);
    const int buf = static_cast<int>(c.algorithmState().shmIteration++ & 1);
    publish(buf, off, m);
    shmBarrier(c, shm);
    if (first) checkSameCall(c, shm, buf, call);
    first = false;
    consume(buf, off, m);
    off += m;
  } while (off < count);
}

// Calls f(j, a, b) for each part of element range [from, to) of the
// concatenation of n pieces of m elements, piece `skip` left out (-1: none):
// [a, b) within piece j. How a worker's range of a whole chunk maps onto
// ranks' slots or blocks.
template <class F>
void eachPiece(int n, int skip, size_t m, size_t from, size_t to, F&& f) {
  for (int j = 0, k = 0; j < n; ++j) {
    if (j == skip) continue;
    const size_t s = static_cast<size_t>(k++) * m, a = std::max(from, s), b = std::min(to, s + m);
    if (a < b) f(j, a - s, b - s);
  }
}

// reduceMany over elements [lo, hi) of `out` and of each of the n inputs
// (kernel operator `op`), on the calling thread: a worker's share.
void reduceRange(DataType t, ReduceOp op, char* out, const void* const* ins, int n, size_t lo, size_t hi);

// The input pointers of one reduction, per thread and without allocating per call.
const void** inputsArray(int n);

}  // namespace roce::algorithms::detail
