// What a rank sends the owner of a window it reaches over the network (a
// peer on another machine): a fixed head per operation on the window's head
// tag, and a put's bytes after it on the data tag; a get's bytes come back
// on the reply tag. Transports are FIFO per (peer, tag), and the owner takes
// a peer's next head only once the bytes of its previous put have landed
// (or of its get have left), so a signal counts only after every put the
// same peer made before it, and a get sees them.
#pragma once
#include <cstdint>

namespace roce::window {

enum class WindowOpKind : uint32_t { Put = 1, Signal = 2, Close = 3, Get = 4 };

struct WindowOp {
  uint32_t kind = 0;      // WindowOpKind
  uint32_t reserved = 0;
  uint64_t offset = 0;    // bytes from the window's start (Put, Get)
  uint64_t bytes = 0;     // the put's or get's length
};
static_assert(sizeof(WindowOp) == 24);

// Tags of window `id` (numbered alike on every rank: creation is collective).
// Bit 62 keeps them apart from collectives (a sequence number far below it)
// and from point-to-point messages (bit 63).
inline uint64_t windowHeadTag(uint64_t id) { return (1ull << 62) | (id << 2); }
inline uint64_t windowDataTag(uint64_t id) { return (1ull << 62) | (id << 2) | 1; }
inline uint64_t windowReplyTag(uint64_t id) { return (1ull << 62) | (id << 2) | 2; }

}  // namespace roce::window
