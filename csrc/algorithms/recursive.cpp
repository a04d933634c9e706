// Recursive doubling and Rabenseifner allreduce (cost models in
// docs/ALGORITHMS.md, "Cost terms"). Both work on a power-of-two set of
// "survivors": with p = p2 + r ranks (p2 the largest power of two <= p), the
// first 2r positions pair up, the even one hands its whole vector to the odd
// one and sits out, and gets the result back at the end (two extra messages
// instead of a general algorithm for any p).
//
// Every element's final value is bitwise the same on all ranks: recursive
// doubling combines the same two partial results on both partners (the kernel
// operators are commutative), and Rabenseifner computes each element on one
// rank and copies it.
#include "recursive.hpp"

#include <cstdint>

#include "../comm/communicator.hpp"
#include "../reduce/reduce.hpp"
#include "on_workers.hpp"
#include "ring.hpp"

namespace roce::algorithms {
using namespace roce::comm;
using namespace roce::reduce;

void RecursiveDoubling::run(const AllreduceCall& a) {
  recursiveDoublingAllreduce(a.c, a.team, a.tag, a.data, a.count, a.t, a.op);
}

void Rabenseifner::run(const AllreduceCall& a) { rabenseifnerAllreduce(a.c, a.team, a.tag, a.data, a.count, a.t, a.op); }

namespace {

// Scratch buffer index of these algorithms (0 is the ring's, 1 the callers' working copies).
constexpr int kScratch = 2;

struct Survivors {
  int p2 = 1;      // power of two <= team size
  int extra = 0;   // team size - p2: this many even positions sit out
  int v = -1;      // this rank's survivor index, -1 if it sits out

  explicit Survivors(const Team& team) {
    const int n = team.size();
    while (p2 * 2 <= n) p2 *= 2;
    extra = n - p2;
    const int i = team.index;
    if (i < 2 * extra) v = (i % 2) ? i / 2 : -1;
    else v = i - extra;
  }
  // Team position of survivor index s.
  int position(int s) const { return s < extra ? 2 * s + 1 : s + extra; }
};

void exchange(Communicator& c, int peer, uint64_t tag, void* sendBuf, size_t sendBytes, void* recvBuf,
              size_t recvBytes) {
  Request* reqs[2] = {c.post(Request::Kind::Recv, peer, tag, recvBuf, recvBytes),
                      c.post(Request::Kind::Send, peer, tag, sendBuf, sendBytes)};
  c.waitAll(reqs, 2);
}

// Before: the folded-out ranks hand their vector to their odd neighbour.
void foldIn(Communicator& c, const Team& team, const Survivors& s, uint64_t tag, char* data, size_t count,
            DataType t, ReduceOp op) {
  const int i = team.index;
  if (i >= 2 * s.extra) return;
  const size_t bytes = count * elementSize(t);
  if (s.v < 0) {
    c.wait(*c.post(Request::Kind::Send, team.rankAt(i + 1), tag, data, bytes));
  } else {
    char* tmp = static_cast<char*>(c.scratch(bytes, kScratch));
    c.wait(*c.post(Request::Kind::Recv, team.rankAt(i - 1), tag, tmp, bytes));
    detail::reduceIntoOnWorkers(c, t, op, data, tmp, count);
  }
}

// After: the result goes back to the ranks that sat out.
void foldOut(Communicator& c, const Team& team, const Survivors& s, uint64_t tag, char* data, size_t bytes) {
  const int i = team.index;
  if (i >= 2 * s.extra) return;
  if (s.v < 0) c.wait(*c.post(Request::Kind::Recv, team.rankAt(i + 1), tag, data, bytes));
  else c.wait(*c.post(Request::Kind::Send, team.rankAt(i - 1), tag, data, bytes));
}

}  // namespace

void recursiveDoublingAllreduce(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count,
                                DataType t, ReduceOp op) {
  if (team.size() == 1) return;
  char* buf = static_cast<char*>(data);
  const size_t bytes = count * elementSize(t);
  const Survivors s(team);
  foldIn(c, team, s, tag, buf, count, t, op);
  if (s.v >= 0) {
    char* tmp = static_cast<char*>(c.scratch(bytes, kScratch));
    for (int mask = 1; mask < s.p2; mask <<= 1) {
      const int peer = team.rankAt(s.position(s.v ^ mask));
      exchange(c, peer, tag, buf, bytes, tmp, bytes);
      detail::reduceIntoOnWorkers(c, t, op, buf, tmp, count);
    }
  }
  foldOut(c, team, s, tag, buf, bytes);
}

void rabenseifnerAllreduce(Communicator& c, const Team& team, uint64_t tag, void* data, size_t count, DataType t,
                           ReduceOp op) {
  if (team.size() == 1) return;
  char* buf = static_cast<char*>(data);
  const size_t esz = elementSize(t);
  const Survivors s(team);
  foldIn(c, team, s, tag, buf, count, t, op);
  if (s.v >= 0) {
    // p2 blocks; survivor v ends the halving owning block v. Blocks [a, b) are contiguous elements.
    const RingSegments blocks = RingSegments::even(count, s.p2);
    auto start = [&](int b) { return b < s.p2 ? blocks.offset[b] : count; };
    char* tmp = static_cast<char*>(c.scratch((count / 2 + s.p2) * esz, kScratch));
    int lo = 0, hi = s.p2;
    for (int mask = s.p2 / 2; mask >= 1; mask /= 2) {
      const int peer = team.rankAt(s.position(s.v ^ mask));
      const int mid = lo + mask;
      const bool upper = s.v & mask;  // keep [mid, hi), give away [lo, mid)
      const int keepLo = upper ? mid : lo, keepHi = upper ? hi : mid;
      const int sendLo = upper ? lo : mid, sendHi = upper ? mid : hi;
      const size_t keepN = start(keepHi) - start(keepLo), sendN = start(sendHi) - start(sendLo);
      exchange(c, peer, tag, buf + start(sendLo) * esz, sendN * esz, tmp, keepN * esz);
      detail::reduceIntoOnWorkers(c, t, op, buf + start(keepLo) * esz, tmp, keepN);
      lo = keepLo;
      hi = keepHi;
    }
    // Recursive doubling of the owned range: after the step with `mask`, this
    // rank holds the aligned run of 2*mask blocks containing v.
    for (int mask = 1; mask < s.p2; mask <<= 1) {
      const int peer = team.rankAt(s.position(s.v ^ mask));
      const int mine = s.v & ~(mask - 1), theirs = mine ^ mask;
      exchange(c, peer, tag, buf + start(mine) * esz, (start(mine + mask) - start(mine)) * esz,
               buf + start(theirs) * esz, (start(theirs + mask) - start(theirs)) * esz);
    }
  }
  foldOut(c, team, s, tag, buf, count * esz);
}

}  // namespace roce::algorithms
