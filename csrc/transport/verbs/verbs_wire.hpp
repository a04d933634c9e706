// What two verbs ranks write to each other: control messages (64-byte SENDs
// on queue pair 0), the 64-byte header that ends every data chunk in a landing
// slot, and how work-request ids name what completed. docs/ARCHITECTURE.md,
// "The verbs transport", describes the protocol these carry.
#pragma once
#include <cstdint>

#include "port_choice.hpp"

namespace roce::transport::verbs {

// kAck only returns control credits (when there is nothing else to carry them).
enum CtrlType : uint32_t { kRts = 1, kRtr = 2, kCredit = 3, kNack = 4, kAck = 5 };

struct Ctrl {
  uint32_t type = 0;
  uint32_t id = 0;       // RTR/NACK: receive id; CREDIT: the landing slot granted (the immediate to write with)
  uint64_t tag = 0;
  uint64_t len = 0;      // RTS/RTR: message size; NACK: the sender's size
  uint32_t credits = 0;  // control receives the sender re-posted since its last message
  // RTR with addr: the receive buffer's rkey on each of the receiver's rails
  // (a piece goes through some queue pair, which lands on one of them).
  // CREDIT: the landing slot's rkey on each rail.
  uint32_t rkey[kMaxRails] = {};
  uint32_t pad = 0;
  // RTR: receive buffer for zero copy (0: copy through landing slots);
  // CREDIT: the landing slot's address (the process's landing pool grows by
  // separately registered regions, so a peer cannot compute it).
  uint64_t addr = 0;
  uint64_t piece = 0;    // RTR with addr: bytes per RDMA write; the receiver counts pieces of this size
};
static_assert(sizeof(Ctrl) == 64);
static_assert(kMaxRails == 4, "Ctrl carries one rkey per rail in 64 bytes");

inline Ctrl makeCtrl(CtrlType type, uint32_t id = 0, uint64_t tag = 0, uint64_t len = 0) {
  Ctrl c;
  c.type = type;
  c.id = id;
  c.tag = tag;
  c.len = len;
  return c;
}

// Written into a landing slot by the WRITE_WITH_IMM that completes a chunk.
constexpr uint64_t kSlotZeroCopy = 1;  // the payload went straight into the receive buffer
constexpr uint64_t kSlotEager = 2;     // a whole small message sent without waiting for an RTR (recvId 0)
struct SlotHeader {
  uint64_t recvId;
  uint64_t offset;
  uint64_t len;
  uint64_t flags;
  uint64_t tag;     // eager: the message's tag (the receiver pairs it with a receive)
  uint64_t pad[3];
};
static_assert(sizeof(SlotHeader) == 64);

// What a rank publishes for memory it exposed to one-sided writes (a
// window): Transport::expose's RemoteMemory, read only by the writer's
// transport, which checks every write against `len` before posting it (the
// NIC refuses anything outside the registration as well).
constexpr uint32_t kWindowKeyMagic = 0x524f5731;  // "ROW1"
struct WindowKey {
  uint32_t magic = 0;
  uint32_t rails = 0;  // the owner's rails: rkey[r] is its registration on rail r
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t rkey[kMaxRails] = {};
};
static_assert(sizeof(WindowKey) <= 48, "a WindowKey travels in a RemoteMemory");

constexpr int kCtrlBytes = 64;  // one receive buffer / one entry of a send ring
// Inline bytes asked of each queue pair: a slot header and up to 192 bytes of payload.
constexpr uint32_t kInlineWant = 256;
// Control credits kept back for kAck, so that two ranks that have used up
// their credits can always return each other's.
constexpr int kCtrlReserve = 2;
// Control receives each side keeps posted beyond the data chunks' (the
// control flow-control window).
constexpr int kCtrlRecvs = 32;
// Landing slots a connection keeps granted for eager messages while the pool
// has more than its reserve free (granted at connect, topped up as they land).
constexpr int kStandingGrants = 2;

// wr_id: kind | peer | qp | index.
//   kWrCtrl      a control SEND (index: send-ring entry)
//   kWrData      a copied chunk (index: staging slot)
//   kWrHeader    the header after a zero-copy piece (index: send-ring entry)
//   kWrZeroCopy  an unsignaled payload write; completes only with an error
//   kWrRecv      a receive buffer (index: its position in the receive ring)
//   kWrOneSided  a one-sided write's or read's piece straight from or into
//                the request's buffer (index: the operation's id)
//   kWrOneSidedStaged  one through a staging slot (index: the slot)
enum WrKind : uint64_t {
  kWrCtrl = 1, kWrData = 2, kWrRecv = 3, kWrZeroCopy = 4, kWrHeader = 5, kWrOneSided = 6, kWrOneSidedStaged = 7
};
inline uint64_t wrId(WrKind k, int peer, int qp, uint32_t index) {
  return (static_cast<uint64_t>(k) << 56) | (static_cast<uint64_t>(peer & 0xffffff) << 32) |
         (static_cast<uint64_t>(qp & 0xff) << 24) | (index & 0xffffff);
}
inline WrKind wrKind(uint64_t id) { return static_cast<WrKind>(id >> 56); }
inline int wrPeer(uint64_t id) { return static_cast<int>((id >> 32) & 0xffffff); }
inline int wrQp(uint64_t id) { return static_cast<int>((id >> 24) & 0xff); }
inline uint32_t wrIndex(uint64_t id) { return static_cast<uint32_t>(id & 0xffffff); }

}  // namespace roce::transport::verbs
