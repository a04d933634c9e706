#include "ring.hpp"

#include <algorithm>

#include "../comm/communicator.hpp"
#include "../reduce/reduce.hpp"

namespace roce {
namespace {

struct RingPosition {
  int pos, n, left, right;
  RingPosition(const Communicator& c, const std::vector<int>& order) {
    n = static_cast<int>(order.size());
    pos = static_cast<int>(std::find(order.begin(), order.end(), c.rank()) - order.begin());
    left = order[(pos + n - 1) % n];
    right = order[(pos + 1) % n];
  }
  int seg(int delta) const { return ((pos + delta) % n + n) % n; }
};

// Splits [offset, offset+count) elements into pipeline chunks.
template <class Fn>
void forChunks(size_t count, size_t chunkElems, Fn&& fn) {
  for (size_t done = 0; done < count; done += chunkElems) fn(done, std::min(chunkElems, count - done));
}

}  // namespace

size_t RingSegments::maxCount() const {
  return count.empty() ? 0 : *std::max_element(count.begin(), count.end());
}

RingSegments RingSegments::even(size_t count, int n) {
  RingSegments s;
  size_t at = 0;
  for (int q = 0; q < n; ++q) {
    size_t c = count / n + (static_cast<size_t>(q) < count % n ? 1 : 0);
    s.offset.push_back(at);
    s.count.push_back(c);
    at += c;
  }
  return s;
}

RingSegments RingSegments::blocks(const std::vector<int>& ringOrder, size_t blockCount) {
  RingSegments s;
  for (int r : ringOrder) {
    s.offset.push_back(static_cast<size_t>(r) * blockCount);
    s.count.push_back(blockCount);
  }
  return s;
}

void ringReduceScatter(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data,
                       const RingSegments& segs, DataType t, ReduceOp op) {
  const RingPosition rp(c, order);
  if (rp.n == 1) return;
  const size_t esz = elementSize(t);
  const size_t chunkElems = std::max<size_t>(1, c.config().chunkBytes / esz);
  char* base = static_cast<char*>(data);
  char* incoming = static_cast<char*>(c.scratch(segs.maxCount() * esz, 0));
  std::vector<Request*> recvs, sends;
  for (int s = 0; s < rp.n - 1; ++s) {
    const int sendSeg = rp.seg(-s - 1), recvSeg = rp.seg(-s - 2);
    recvs.clear();
    sends.clear();
    forChunks(segs.count[recvSeg], chunkElems, [&](size_t at, size_t n) {
      recvs.push_back(c.post(Request::Kind::Recv, rp.left, tag, incoming + at * esz, n * esz));
    });
    forChunks(segs.count[sendSeg], chunkElems, [&](size_t at, size_t n) {
      sends.push_back(c.post(Request::Kind::Send, rp.right, tag, base + (segs.offset[sendSeg] + at) * esz, n * esz));
    });
    // Reduce each chunk as soon as it lands, while later chunks are in flight.
    size_t k = 0;
    forChunks(segs.count[recvSeg], chunkElems, [&](size_t at, size_t n) {
      c.wait(*recvs[k++]);
      reduceInto(t, op, base + (segs.offset[recvSeg] + at) * esz, incoming + at * esz, n);
    });
    c.waitAll(sends.data(), sends.size());
  }
}

void ringAllgather(Communicator& c, const std::vector<int>& order, uint64_t tag, void* data, const RingSegments& segs,
                   size_t esz) {
  const RingPosition rp(c, order);
  if (rp.n == 1) return;
  const size_t chunkElems = std::max<size_t>(1, c.config().chunkBytes / esz);
  char* base = static_cast<char*>(data);
  std::vector<Request*> reqs;
  for (int s = 0; s < rp.n - 1; ++s) {
    const int sendSeg = rp.seg(-s), recvSeg = rp.seg(-s - 1);
    reqs.clear();
    forChunks(segs.count[recvSeg], chunkElems, [&](size_t at, size_t n) {
      reqs.push_back(c.post(Request::Kind::Recv, rp.left, tag, base + (segs.offset[recvSeg] + at) * esz, n * esz));
    });
    forChunks(segs.count[sendSeg], chunkElems, [&](size_t at, size_t n) {
      reqs.push_back(c.post(Request::Kind::Send, rp.right, tag, base + (segs.offset[sendSeg] + at) * esz, n * esz));
    });
    c.waitAll(reqs.data(), reqs.size());
  }
}

}  // namespace roce
