#include "scratch_buffers.hpp"

#include <cstdlib>

#include "../common/error.hpp"

namespace roce::comm {

void ScratchBuffers::FreeDeleter::operator()(char* p) const { std::free(p); }

void* ScratchBuffers::get(size_t bytes, int index) {
  if (blocks_.size() <= static_cast<size_t>(index)) {
    blocks_.resize(index + 1);
    bytes_.resize(index + 1, 0);
  }
  if (bytes_[index] < bytes) {
    const size_t n = (bytes + 4095) & ~size_t(4095);
    void* p = std::aligned_alloc(64, n);
    if (!p) throwComm(str("out of memory allocating ", n, " bytes of scratch"));
    blocks_[index] = std::shared_ptr<char>(static_cast<char*>(p), FreeDeleter{});
    bytes_[index] = n;
  }
  return blocks_[index].get();
}

bool ScratchBuffers::ownerOf(const void* buf, size_t len, BufferOwner& owner) const {
  for (size_t i = 0; i < blocks_.size(); ++i) {
    BufferOwner o{std::static_pointer_cast<void>(blocks_[i]), blocks_[i].get(), blocks_[i].get(), bytes_[i]};
    if (o.covers(buf, len)) {
      owner = std::move(o);
      return true;
    }
  }
  return false;
}

}  // namespace roce::comm
