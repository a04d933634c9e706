#include "tcp_mux.hpp"

#include <algorithm>
#include <cstdint>

#include "../../common/wakeup.hpp"

namespace roce::transport::tcp {

void TcpMux::adopt(const std::string& peerKey, int fd, std::string addr) {
  {
    // Under linksMu_, so nobody sees the link before it has its socket.
    std::lock_guard<std::mutex> g(linksMu_);
    auto& slot = links_[peerKey];
    // A dead link (its process is gone) stays with the groups that used it;
    // a process at the same key now is another one.
    if (!slot || !slot->alive()) slot = std::make_shared<MuxLink>(*this);
    slot->addSocket(fd, std::move(addr));
  }
  wakeGroups();  // groups waiting for a dial to this process use the link now
}

FirstContact TcpMux::firstContact(const std::string& peerKey, uint64_t nonce) {
  std::lock_guard<std::mutex> g(linksMu_);
  if (auto it = links_.find(peerKey); it != links_.end() && it->second->alive()) return FirstContact::Linked;
  const auto now = Clock::now();
  auto [it, fresh] = dialing_.try_emplace(peerKey, Claim{nonce, now});
  if (fresh || it->second.nonce == nonce) return FirstContact::Dial;
  if (now - it->second.since < kStaleClaim) return FirstContact::Wait;
  it->second = Claim{nonce, now};
  return FirstContact::Dial;
}

void TcpMux::endDial(const std::string& peerKey, uint64_t nonce) {
  {
    std::lock_guard<std::mutex> g(linksMu_);
    auto it = dialing_.find(peerKey);
    if (it == dialing_.end() || it->second.nonce != nonce) return;
    dialing_.erase(it);
  }
  wakeGroups();  // a dial that failed: the waiting groups dial themselves
}

void TcpMux::wakeGroups() {
  std::lock_guard<std::mutex> g(groupsMu_);
  for (auto& [nonce, grp] : groups_) grp.wake->wake();
}

std::shared_ptr<MuxLink> TcpMux::find(const std::string& peerKey) {
  std::lock_guard<std::mutex> g(linksMu_);
  auto it = links_.find(peerKey);
  if (it == links_.end()) return nullptr;
  if (!it->second->alive()) {
    links_.erase(it);
    return nullptr;
  }
  return it->second;
}

std::vector<std::shared_ptr<MuxLink>> TcpMux::snapshot() {
  std::lock_guard<std::mutex> g(linksMu_);
  std::vector<std::shared_ptr<MuxLink>> links;
  for (auto& [key, l] : links_) links.push_back(l);
  return links;
}

size_t TcpMux::sockets() {
  size_t n = 0;
  for (auto& l : snapshot())
    if (l->alive()) n += l->sockets();
  return n;
}

size_t TcpMux::parkedStreams() {
  size_t n = 0;
  for (auto& l : snapshot()) n += l->parked();
  return n;
}

void TcpMux::registerGroup(uint64_t nonce, int rank, Wakeup* wake, std::atomic<bool>* newPeers) {
  {
    std::lock_guard<std::mutex> g(groupsMu_);
    groups_[nonce] = Group{rank, wake, newPeers, {}};
    closed_.erase(nonce);
  }
  // Streams that started before the group existed here.
  const auto links = snapshot();
  std::vector<int> peers;
  for (auto& l : links)
    for (int p : l->claimParked(nonce, wake)) peers.push_back(p);
  if (peers.empty()) return;
  std::lock_guard<std::mutex> g(groupsMu_);
  Group& grp = groups_.at(nonce);
  grp.newPeers.insert(grp.newPeers.end(), peers.begin(), peers.end());
  newPeers->store(true);
}

void TcpMux::unregisterGroup(uint64_t nonce) {
  bool wasDialing = false;
  {
    // Its dials in flight end with it: groups waiting for them dial themselves.
    std::lock_guard<std::mutex> g(linksMu_);
    wasDialing = std::erase_if(dialing_, [&](const auto& kv) { return kv.second.nonce == nonce; }) > 0;
  }
  {
    std::lock_guard<std::mutex> g(groupsMu_);
    if (auto it = groups_.find(nonce); it != groups_.end()) {
      closed_[nonce] = it->second.rank;
      groups_.erase(it);
    }
  }
  if (wasDialing) wakeGroups();
}

void TcpMux::dropGroup(uint64_t nonce, int rank) {
  for (auto& l : snapshot()) l->dropGroup(nonce, rank);
}

std::vector<int> TcpMux::takeNewPeers(uint64_t nonce) {
  std::lock_guard<std::mutex> g(groupsMu_);
  auto it = groups_.find(nonce);
  if (it == groups_.end()) return {};
  it->second.flag->store(false);
  return std::exchange(it->second.newPeers, {});
}

TcpMux::Fate TcpMux::fate(uint64_t nonce, int srcRank, Wakeup** wake, int* closedRank, bool claim) {
  std::lock_guard<std::mutex> g(groupsMu_);
  auto it = groups_.find(nonce);
  if (it != groups_.end()) {
    if (claim) {
      it->second.newPeers.push_back(srcRank);
      it->second.flag->store(true);
    }
    *wake = it->second.wake;
    return Fate::Owned;
  }
  auto c = closed_.find(nonce);
  if (c != closed_.end()) {
    *closedRank = c->second;
    return Fate::Closed;
  }
  return Fate::Unknown;
}

Clock::time_point TcpMux::tick(Clock::time_point now) {
  if (now >= nextParkCheck_) {
    nextParkCheck_ = now + std::chrono::seconds(60);
    for (auto& l : snapshot()) l->dropStaleParked(now);
  }
  // The next round comes when a link busy now turns idle (addPollFds runs after this).
  auto next = nextParkCheck_;
  for (auto& l : snapshot()) next = std::min(next, l->idleDeadline(now));
  return next;
}

void TcpMux::addPollFds(std::vector<pollfd>& fds) {
  polledLinks_.clear();
  const auto now = Clock::now();
  for (auto& l : snapshot()) {
    const size_t before = fds.size();
    l->addRuntimePollFds(fds, now);
    polledLinks_.push_back({l, fds.size() - before});
  }
}

void TcpMux::polled(const pollfd* fds, size_t n) {
  size_t at = 0;
  for (auto& [link, count] : polledLinks_) {
    if (at + count > n) break;
    link->runtimePolled(fds + at, count);
    at += count;
  }
  polledLinks_.clear();
}

}  // namespace roce::transport::tcp
