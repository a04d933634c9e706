// Collectives that are plain exchanges of blocks: gather, scatter, all-to-all,
// and the zero-byte dissemination barrier.
#include <cstring>

#include "../comm/communicator.hpp"
#include "algorithms.hpp"

namespace roce {
namespace {

void postAllAndWait(Communicator& c, std::vector<Request>& reqs) {
  std::vector<Request*> ptrs;
  for (auto& r : reqs) {
    c.post(r);
    ptrs.push_back(&r);
  }
  c.waitAll(ptrs.data(), ptrs.size());
}

}  // namespace

void gather(Communicator& c, const void* input, void* output, size_t blockBytes, int root) {
  const uint64_t tag = c.nextCollectiveTag();
  std::vector<Request> reqs;
  if (c.rank() == root) {
    char* out = static_cast<char*>(output);
    std::memcpy(out + static_cast<size_t>(root) * blockBytes, input, blockBytes);
    for (int r = 0; r < c.size(); ++r)
      if (r != root) reqs.push_back({Request::Kind::Recv, r, tag, out + static_cast<size_t>(r) * blockBytes, blockBytes});
  } else {
    reqs.push_back({Request::Kind::Send, root, tag, const_cast<void*>(input), blockBytes});
  }
  postAllAndWait(c, reqs);
}

void scatter(Communicator& c, const void* input, void* output, size_t blockBytes, int root) {
  const uint64_t tag = c.nextCollectiveTag();
  std::vector<Request> reqs;
  if (c.rank() == root) {
    const char* in = static_cast<const char*>(input);
    std::memcpy(output, in + static_cast<size_t>(root) * blockBytes, blockBytes);
    for (int r = 0; r < c.size(); ++r)
      if (r != root)
        reqs.push_back({Request::Kind::Send, r, tag, const_cast<char*>(in) + static_cast<size_t>(r) * blockBytes, blockBytes});
  } else {
    reqs.push_back({Request::Kind::Recv, root, tag, output, blockBytes});
  }
  postAllAndWait(c, reqs);
}

void alltoallv(Communicator& c, const void* input, const std::vector<size_t>& sendBytes,
               const std::vector<size_t>& sendOffsets, void* output, const std::vector<size_t>& recvBytes,
               const std::vector<size_t>& recvOffsets) {
  const uint64_t tag = c.nextCollectiveTag();
  const int n = c.size(), me = c.rank();
  char* out = static_cast<char*>(output);
  char* in = const_cast<char*>(static_cast<const char*>(input));
  if (sendBytes[me] != recvBytes[me])
    throw std::logic_error("alltoall: self send and receive sizes differ");  // checked by the adapter
  std::memmove(out + recvOffsets[me], in + sendOffsets[me], sendBytes[me]);
  std::vector<Request> reqs;
  // Receives first, then sends in a staggered order so no rank is hit by all at once.
  for (int i = 1; i < n; ++i) {
    int from = (me - i + n) % n;
    reqs.push_back({Request::Kind::Recv, from, tag, out + recvOffsets[from], recvBytes[from]});
  }
  for (int i = 1; i < n; ++i) {
    int to = (me + i) % n;
    reqs.push_back({Request::Kind::Send, to, tag, in + sendOffsets[to], sendBytes[to]});
  }
  postAllAndWait(c, reqs);
}

void barrier(Communicator& c) {
  const uint64_t tag = c.nextCollectiveTag();
  const int n = c.size(), me = c.rank();
  // Dissemination: after round k every rank has heard, transitively, from 2^k others.
  for (int dist = 1; dist < n; dist <<= 1) {
    std::vector<Request> reqs{{Request::Kind::Recv, (me - dist + n) % n, tag, nullptr, 0},
                              {Request::Kind::Send, (me + dist) % n, tag, nullptr, 0}};
    postAllAndWait(c, reqs);
  }
}

}  // namespace roce
