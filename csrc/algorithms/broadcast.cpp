// Broadcast along a binomial tree rooted at `root`, pipelined in chunks: a rank
// forwards chunk k to its children as soon as chunk k arrived from its parent.
#include <algorithm>

#include "../comm/communicator.hpp"
#include "algorithms.hpp"

namespace roce {

void broadcast(Communicator& c, void* data, size_t bytes, int root) {
  const int n = c.size();
  const uint64_t tag = c.nextCollectiveTag();
  if (n == 1) return;
  const int vr = (c.rank() - root + n) % n;  // rank relative to the root
  auto real = [&](int v) { return (v + root) % n; };
  // Parent: clear the lowest set bit. Children: vr + m for powers of two m below
  // that bit (all powers below n for the root), largest subtree first.
  int low = 1;
  while (low < n && !(vr & low)) low <<= 1;
  std::vector<int> children;
  for (int m = low >> 1; m >= 1; m >>= 1)
    if (vr + m < n) children.push_back(real(vr + m));

  const size_t chunk = c.config().chunkBytes;
  const size_t numChunks = bytes == 0 ? 1 : (bytes + chunk - 1) / chunk;
  char* base = static_cast<char*>(data);
  std::vector<Request*> recvs, sends;
  auto piece = [&](size_t k) { return std::min(chunk, bytes - std::min(bytes, k * chunk)); };
  if (vr != 0) {
    const int parent = real(vr - low);
    for (size_t k = 0; k < numChunks; ++k)
      recvs.push_back(c.post(Request::Kind::Recv, parent, tag, base + k * chunk, piece(k)));
  }
  for (size_t k = 0; k < numChunks; ++k) {
    if (vr != 0) c.wait(*recvs[k]);
    for (int child : children) sends.push_back(c.post(Request::Kind::Send, child, tag, base + k * chunk, piece(k)));
  }
  c.waitAll(sends.data(), sends.size());
}

}  // namespace roce
