// A group's scratch memory, reused across operations: independent buffers by
// index (each algorithm family has its own, see the kScratch* constants in
// csrc/algorithms/), grown to the largest size asked for and never shrunk.
// Buffers are shared pointers because a transport's registration cache may
// keep a replaced block alive until it drops the registration (BufferOwner).
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "../transport/transport.hpp"

namespace roce::comm {
using namespace roce::transport;

class ScratchBuffers {
 public:
  // At least `bytes` (rounded up to pages, 64-byte aligned) in buffer `index`;
  // the contents do not survive growth. Throws when memory runs out.
  void* get(size_t bytes, int index);
  // The buffer that holds [buf, buf + len) as an owner a zero-copy transport
  // may register, or false when none does.
  bool ownerOf(const void* buf, size_t len, BufferOwner& owner) const;

 private:
  struct FreeDeleter {
    void operator()(char* p) const;
  };
  std::vector<std::shared_ptr<char>> blocks_;
  std::vector<size_t> bytes_;
};

}  // namespace roce::comm
