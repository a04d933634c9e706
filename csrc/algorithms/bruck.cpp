// Bruck allgather: ceil(lg p) rounds for any p (the ring needs p-1), for small
// blocks where latency dominates. Round k sends the first min(2^k, p-2^k)
// gathered blocks to rank-2^k and receives as many from rank+2^k, so block i
// of the working buffer is rank (me+i)'s; a final rotation puts blocks in
// rank order.
#include <algorithm>
#include <cstdint>

#include "../comm/communicator.hpp"
#include "../common/bytes.hpp"
#include "algorithms.hpp"

namespace roce::algorithms::detail {
using namespace roce::comm;

void bruckAllgather(Communicator& c, uint64_t tag, const void* input, void* output, size_t blockBytes) {
  const int n = c.size(), me = c.rank();
  char* work = static_cast<char*>(c.scratch(static_cast<size_t>(n) * blockBytes, 2));
  copyBytes(work, input, blockBytes);
  for (int dist = 1; dist < n; dist <<= 1) {
    const size_t blocks = static_cast<size_t>(std::min(dist, n - dist));
    Request* reqs[2] = {
        c.post(Request::Kind::Recv, (me + dist) % n, tag, work + dist * blockBytes, blocks * blockBytes),
        c.post(Request::Kind::Send, (me - dist + n) % n, tag, work, blocks * blockBytes)};
    c.waitAll(reqs, 2);
  }
  char* out = static_cast<char*>(output);
  const size_t head = static_cast<size_t>(n - me) * blockBytes;  // blocks of ranks me..n-1
  copyBytes(out + static_cast<size_t>(me) * blockBytes, work, head);
  copyBytes(out, work + head, static_cast<size_t>(me) * blockBytes);
}

}  // namespace roce::algorithms::detail
