// Broadcast, pipelined in chunks: a rank forwards chunk k to its children as
// soon as chunk k arrived from its parent. Two shapes of the same loop:
//  * binomial tree rooted at `root` (lg p hops; the root sends the whole
//    message lg p times), for small and medium messages;
//  * chain along the node-sorted ring starting at the root (p-1 hops, but
//    every rank sends the message once, so with chunks in flight the time
//    approaches one message's transfer), from
//    ROCE_PG_ALGO_RING_MIN_BYTES on groups of 3 or more.
// (A group on one machine broadcasts through the shared-memory slots instead,
// shm_copies.cpp, unless ROCE_PG_ALGO_BROADCAST names one of these two.)
#include <algorithm>
#include <cstdint>

#include "../comm/communicator.hpp"
#include "algorithms.hpp"
#include "select.hpp"

namespace roce::algorithms {
using namespace roce::comm;

namespace {

struct Links {
  int parent = -1;  // -1 at the root
  std::vector<int> children;
};

Links binomial(int me, int n, int root) {
  Links l;
  const int vr = (me - root + n) % n;  // rank relative to the root
  auto real = [&](int v) { return (v + root) % n; };
  // Parent: clear the lowest set bit. Children: vr + m for powers of two m below
  // that bit (all powers below n for the root), largest subtree first.
  int low = 1;
  while (low < n && !(vr & low)) low <<= 1;
  for (int m = low >> 1; m >= 1; m >>= 1)
    if (vr + m < n) l.children.push_back(real(vr + m));
  if (vr != 0) l.parent = real(vr - low);
  return l;
}

Links chain(const std::vector<int>& order, int me, int root) {
  Links l;
  const int n = static_cast<int>(order.size());
  const int pos = static_cast<int>(std::find(order.begin(), order.end(), me) - order.begin());
  const int rootPos = static_cast<int>(std::find(order.begin(), order.end(), root) - order.begin());
  const int rel = (pos - rootPos + n) % n;
  if (rel > 0) l.parent = order[(pos + n - 1) % n];
  if (rel < n - 1) l.children.push_back(order[(pos + 1) % n]);
  return l;
}

}  // namespace

void broadcast(Communicator& c, void* data, size_t bytes, int root) {
  const int n = c.size();
  const Algo algo = n == 1 ? Algo::Binomial : chooseBroadcast(c, bytes);
  if (algo == Algo::Shm) return detail::shmBroadcast(c, data, bytes, root);
  const uint64_t tag = c.nextCollectiveTag();
  if (n == 1) return;
  const Links links = algo == Algo::Chain ? chain(c.topology().ringOrder, c.rank(), root)
                                          : binomial(c.rank(), n, root);
  const size_t chunk = c.config().algo.chunkBytes;
  const size_t numChunks = bytes == 0 ? 1 : (bytes + chunk - 1) / chunk;
  char* base = static_cast<char*>(data);
  std::vector<Request*> recvs, sends;
  auto piece = [&](size_t k) { return std::min(chunk, bytes - std::min(bytes, k * chunk)); };
  if (links.parent >= 0)
    for (size_t k = 0; k < numChunks; ++k)
      recvs.push_back(c.post(Request::Kind::Recv, links.parent, tag, base + k * chunk, piece(k)));
  for (size_t k = 0; k < numChunks; ++k) {
    if (links.parent >= 0) c.wait(*recvs[k]);
    for (int child : links.children)
      sends.push_back(c.post(Request::Kind::Send, child, tag, base + k * chunk, piece(k)));
  }
  c.waitAll(sends.data(), sends.size());
}

}  // namespace roce::algorithms
