// In what order one window registration's operations to a peer on another
// machine may go (window_service.hpp's tasks ask it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace roce::window {

// The order of one registration's operations per served peer (progress
// thread only). To a peer that exposed its window, a put is a one-sided
// write and a get a one-sided read (Request::Kind::Write, Read): they travel
// apart from messages (signals, closes, and puts and gets to a peer that did
// not expose) and from each other, on any of the connection's queue pairs.
// So an operation goes only once every earlier one it must follow completed:
//   * a message after every earlier write and read (a signal counts only
//     after the puts before it landed and the gets before it read; a close
//     ends the peer's exposure);
//   * a read after every earlier write (a get sees the puts before it);
//   * a write after every earlier message and read (a get must not see a
//     later put), and after every earlier write to bytes it overlaps (two
//     puts to the same bytes land in issue order, as messages would).
// Messages among themselves need no waiting (FIFO per tag), nor do reads,
// nor writes to different bytes.
class WindowOrder {
 public:
  enum class Kind : uint8_t { Message, Read, Write };
  explicit WindowOrder(int ranks) : peers_(static_cast<size_t>(ranks)) {}
  // [offset, offset + bytes) of the peer's window: what a write covers.
  uint64_t enter(int peer, Kind kind, uint64_t offset = 0, uint64_t bytes = 0);
  bool mayGo(int peer, uint64_t ticket) const;
  void leave(int peer, uint64_t ticket);

 private:
  struct Entry {
    Kind kind;
    uint64_t offset, bytes;
  };
  struct Peer {
    uint64_t next = 0;
    std::map<uint64_t, Entry> open;  // entered, not finished, by ticket
  };
  std::vector<Peer> peers_;
};

}  // namespace roce::window
