// Collectives that are plain exchanges of blocks: gather, scatter, all-to-all,
// and the zero-byte dissemination barrier (a group on one machine synchronises
// through shared memory instead: shm_barrier.hpp).
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "../comm/communicator.hpp"
#include "algorithms.hpp"
#include "shm_barrier.hpp"

namespace roce::algorithms {
using namespace roce::comm;

namespace {

// Requests to post together: (kind, peer, buffer, bytes) under one tag.
struct Exchange {
  Communicator& c;
  uint64_t tag;
  std::vector<Request*> reqs;
  void send(int peer, const void* buf, size_t len) {
    reqs.push_back(c.post(Request::Kind::Send, peer, tag, const_cast<void*>(buf), len));
  }
  void recv(int peer, void* buf, size_t len) { reqs.push_back(c.post(Request::Kind::Recv, peer, tag, buf, len)); }
  void waitAll() { c.waitAll(reqs.data(), reqs.size()); }
};

}  // namespace

void gather(Communicator& c, const void* input, void* output, size_t blockBytes, int root) {
  Exchange x{c, c.nextCollectiveTag(), {}};
  if (c.rank() == root) {
    char* out = static_cast<char*>(output);
    c.copyLocal(out + static_cast<size_t>(root) * blockBytes, input, blockBytes);
    for (int r = 0; r < c.size(); ++r)
      if (r != root) x.recv(r, out + static_cast<size_t>(r) * blockBytes, blockBytes);
  } else {
    x.send(root, input, blockBytes);
  }
  x.waitAll();
}

void scatter(Communicator& c, const void* input, void* output, size_t blockBytes, int root) {
  Exchange x{c, c.nextCollectiveTag(), {}};
  if (c.rank() == root) {
    const char* in = static_cast<const char*>(input);
    c.copyLocal(output, in + static_cast<size_t>(root) * blockBytes, blockBytes);
    for (int r = 0; r < c.size(); ++r)
      if (r != root) x.send(r, in + static_cast<size_t>(r) * blockBytes, blockBytes);
  } else {
    x.recv(root, output, blockBytes);
  }
  x.waitAll();
}

void alltoallv(Communicator& c, const void* input, const std::vector<size_t>& sendBytes,
               const std::vector<size_t>& sendOffsets, void* output, const std::vector<size_t>& recvBytes,
               const std::vector<size_t>& recvOffsets) {
  Exchange x{c, c.nextCollectiveTag(), {}};
  const int n = c.size(), me = c.rank();
  char* out = static_cast<char*>(output);
  char* in = const_cast<char*>(static_cast<const char*>(input));
  if (sendBytes[me] != recvBytes[me])
    throw std::logic_error("alltoall: self send and receive sizes differ");  // checked by the adapter
  c.copyLocal(out + recvOffsets[me], in + sendOffsets[me], sendBytes[me]);
  // Receives first, then sends in a staggered order so no rank is hit by all at once.
  for (int i = 1; i < n; ++i) {
    int from = (me - i + n) % n;
    x.recv(from, out + recvOffsets[from], recvBytes[from]);
  }
  for (int i = 1; i < n; ++i) {
    int to = (me + i) % n;
    x.send(to, in + sendOffsets[to], sendBytes[to]);
  }
  x.waitAll();
}

void barrier(Communicator& c) {
  if (c.nodeShm() && c.size() > 1) return detail::shmBarrierCollective(c, c.barrierTag());
  const uint64_t tag = c.nextCollectiveTag();
  const int n = c.size(), me = c.rank();
  // Dissemination: after round k every rank has heard, transitively, from 2^k others.
  for (int dist = 1; dist < n; dist <<= 1) {
    Exchange x{c, tag, {}};
    x.recv((me - dist + n) % n, nullptr, 0);
    x.send((me + dist) % n, nullptr, 0);
    x.waitAll();
  }
}

}  // namespace roce::algorithms
