// The chunks every TCP stream between two processes travels in (tcp_mux.hpp
// says how streams share a connection): a 32-byte header naming the
// receiving rank's nonce for the group, the sender's nonce and rank, a kind
// and a payload length, then the payload (data chunks only). Here apart from
// the links so that the fuzz target (tests/fuzz/fuzz_mux_chunks.cpp) writes
// the chunks the links read.
#pragma once
#include <cstddef>
#include <cstdint>

namespace roce::transport::tcp {

constexpr uint32_t kChunkMagic = 0x524d5558;  // "RMUX"
// Small enough that a group's chunk never keeps another group's waiting for
// long, and that the tail copy (a partly sent chunk) stays cheap; large
// enough that the 32-byte header costs nothing (0.05%).
constexpr size_t kChunkPayload = 64 << 10;

// OPEN: a group attached a stream (answered GONE if the group is gone at
// the other end, so a rank that only receives learns it too). CREDIT: the
// stream's reader took `len` more of its bytes, which the sender may now
// send (no payload).
enum ChunkFlags : uint16_t { kData = 0, kClose = 1, kGone = 2, kOpenStream = 3, kCredit = 4 };

// Flow control per stream: a sender has at most this many bytes of a stream
// that its reader has not taken yet (in the socket, or in the reader's
// inbox, which a group that is not reading, or not created yet, leaves
// filling), so what a peer can make a rank hold for a stream is bounded.
// The reader gives credit back once it took kCreditEvery bytes, so a
// stream read as it arrives never waits for credit; a reader that gave up
// on the stream credits the bytes it drops.
constexpr size_t kStreamWindow = 4 << 20;
constexpr size_t kCreditEvery = kStreamWindow / 4;

struct ChunkHeader {
  uint32_t magic;
  uint32_t len;       // payload bytes (data chunks only)
  uint64_t dstNonce;  // the receiving rank's nonce for the group
  uint64_t srcNonce;  // the sender's (GONE answers it)
  int32_t srcRank;    // the sender's rank in the group
  uint16_t flags;
  uint16_t check;
};
static_assert(sizeof(ChunkHeader) == 32);

// A hash of the other fields: a misaligned or corrupted stream is told from
// a header before its length is trusted.
uint16_t chunkCheck(const ChunkHeader& h);
ChunkHeader makeHeader(uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t flags, uint32_t len);

}  // namespace roce::transport::tcp
