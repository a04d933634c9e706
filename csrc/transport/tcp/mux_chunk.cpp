#include "mux_chunk.hpp"

namespace roce::transport::tcp {

uint16_t chunkCheck(const ChunkHeader& h) {
  uint64_t x = h.dstNonce * 0x9e3779b97f4a7c15ull ^ h.srcNonce ^ (uint64_t(h.len) << 32 | uint32_t(h.srcRank));
  x ^= uint64_t(h.flags) << 48;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return static_cast<uint16_t>(x ^ (x >> 29) ^ (x >> 47));
}

ChunkHeader makeHeader(uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t flags, uint32_t len) {
  ChunkHeader h{kChunkMagic, len, dstNonce, srcNonce, srcRank, flags, 0};
  h.check = chunkCheck(h);
  return h;
}

}  // namespace roce::transport::tcp
