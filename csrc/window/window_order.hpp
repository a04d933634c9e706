// In what order one window registration's operations to a peer on another
// machine may go (window_service.hpp's tasks ask it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace roce::window {

// The order of one registration's operations per served peer (progress
// thread only). A put to a peer that exposed its window is a one-sided write
// (Request::Kind::Write), which travels apart from messages: so a message
// (a signal's, get's or close's head) or a one-sided read (a get there)
// goes only once every write issued before it to that peer completed, and a
// write only once every message or read issued before it completed (a get
// must not see a later put). Writes among themselves, and messages and
// reads among themselves (messages are FIFO per tag; a read and a signal
// need no order), need no waiting.
class WindowOrder {
 public:
  explicit WindowOrder(int ranks) : peers_(static_cast<size_t>(ranks)) {}
  uint64_t enter(int peer, bool write);
  bool mayGo(int peer, uint64_t ticket) const;
  void leave(int peer, uint64_t ticket);

 private:
  struct Peer {
    uint64_t next = 0;
    std::map<uint64_t, bool> open;  // ticket -> is a write; entered, not finished
  };
  std::vector<Peer> peers_;
};

}  // namespace roce::window
