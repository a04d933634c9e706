#include "window_order.hpp"

namespace roce::window {

uint64_t WindowOrder::enter(int peer, bool write) {
  Peer& p = peers_.at(static_cast<size_t>(peer));
  const uint64_t ticket = p.next++;
  p.open.emplace(ticket, write);
  return ticket;
}

bool WindowOrder::mayGo(int peer, uint64_t ticket) const {
  const Peer& p = peers_.at(static_cast<size_t>(peer));
  const bool write = p.open.at(ticket);
  for (auto it = p.open.begin(); it != p.open.end() && it->first < ticket; ++it)
    if (it->second != write) return false;
  return true;
}

void WindowOrder::leave(int peer, uint64_t ticket) { peers_.at(static_cast<size_t>(peer)).open.erase(ticket); }

}  // namespace roce::window
