#include "window_order.hpp"

namespace roce::window {

namespace {

using Kind = WindowOrder::Kind;

// Whether an operation of kind `later` must wait for an earlier open one.
bool mustFollow(Kind later, Kind earlier, bool overlap) {
  switch (later) {
    case Kind::Message:
      return earlier != Kind::Message;
    case Kind::Read:
      return earlier == Kind::Write;
    case Kind::Write:
      return earlier != Kind::Write || overlap;
  }
  return true;
}

}  // namespace

uint64_t WindowOrder::enter(int peer, Kind kind, uint64_t offset, uint64_t bytes) {
  Peer& p = peers_.at(static_cast<size_t>(peer));
  const uint64_t ticket = p.next++;
  p.open.emplace(ticket, Entry{kind, offset, bytes});
  return ticket;
}

bool WindowOrder::mayGo(int peer, uint64_t ticket) const {
  const Peer& p = peers_.at(static_cast<size_t>(peer));
  const Entry& me = p.open.at(ticket);
  for (auto it = p.open.begin(); it != p.open.end() && it->first < ticket; ++it) {
    const Entry& e = it->second;
    const bool overlap = e.offset < me.offset + me.bytes && me.offset < e.offset + e.bytes;
    if (mustFollow(me.kind, e.kind, overlap)) return false;
  }
  return true;
}

void WindowOrder::leave(int peer, uint64_t ticket) { peers_.at(static_cast<size_t>(peer)).open.erase(ticket); }

}  // namespace roce::window
