#include "process_links.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../common/error.hpp"
#include "../common/sockets.hpp"
#include "connect.hpp"
#include "front_desk.hpp"

namespace roce {
namespace {

constexpr uint32_t kLinkMagic = 0x4c494e4b;  // "LINK"
constexpr size_t kMaxText = 4096;
// A peer process this far behind in reading is hung; its lifelines say so.
constexpr size_t kMaxQueued = 4 << 20;
// The first record on a dialed link: the dialer's process key.
constexpr uint16_t kIdentity = 0x100;
constexpr uint16_t kHeartbeatType = 1;  // liveness/lifeline.cpp's; only counted here
// Records kept for a group this process has not created yet: a member that
// late has timed out its peers anyway (front_desk.cpp parks hellos as long).
constexpr auto kParkLimit = std::chrono::minutes(30);
constexpr size_t kMaxParkedHeartbeats = 64;  // one says the peer is there; the rest add nothing
constexpr size_t kMaxParkedRecords = 4096;
// How long the process with the greater key waits for the other's dial
// before it dials itself (a neighbour that creates the group later).
constexpr auto kYieldToPeerDial = std::chrono::seconds(2);

struct RecordHead {
  uint32_t magic;
  uint16_t type;
  uint16_t len;  // text bytes that follow
  int32_t srcRank;
  uint32_t reserved;
  uint64_t dstNonce;
  uint64_t srcNonce;
};
static_assert(sizeof(RecordHead) == 32);

}  // namespace

struct ProcessLinks::Link {
  int id;
  int fd;
  std::string key;  // the peer process's, once it said (dialed: known from the start)
  std::string inbuf, outbuf;
  bool open = true;
  int err = 0;
  bool corrupted = false;
};

ProcessLinks::ProcessLinks(ProcessRuntime& runtime, FrontDesk& desk)
    : runtime_(runtime), desk_(desk), mailbox_(desk.open(kProcessLinksKey)) {}

ProcessLinks::~ProcessLinks() {
  desk_.close(kProcessLinksKey);
  for (auto& [id, l] : links_)
    if (l->fd >= 0) ::close(l->fd);
}

std::string ProcessLinks::processKey(const std::string& hostId, const std::string& host, int port) {
  return str(hostId, "/", host, ":", port);
}

int ProcessLinks::linkTo(const std::string& peerKey, const std::string& selfKey, const TcpEndpoint& ep, int peerRank,
                         Clock::time_point deadline, const std::function<void()>& probe) {
  {
    std::unique_lock<std::mutex> g(mu_);
    adoptArrivals();
    if (auto it = sendOn_.find(peerKey); it != sendOn_.end()) return it->second;
    if (selfKey > peerKey) {
      // The runtime thread reads the peer's identity record and notifies.
      identified_.wait_until(g, std::min(deadline, Clock::now() + kYieldToPeerDial),
                             [&] { return sendOn_.count(peerKey) > 0; });
      if (auto it = sendOn_.find(peerKey); it != sendOn_.end()) return it->second;
    }
  }
  UniqueFd fd = dialRank(ep, LinkKind::Process, -1, peerRank, 0, kProcessLinksKey, deadline, probe);
  tuneSocket(fd.get());
  setNonBlocking(fd.get(), true);
  int id;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto l = std::make_unique<Link>();
    l->id = nextId_++;
    l->fd = fd.release();
    l->key = peerKey;
    Link& link = *l;
    links_.emplace(link.id, std::move(l));
    // Another group's thread may have linked the same process meanwhile:
    // both links stay (read from), the first one carries this side's records.
    id = sendOn_.emplace(peerKey, link.id).first->second;
    RecordHead h{kLinkMagic, kIdentity, static_cast<uint16_t>(selfKey.size()), -1, 0, 0, 0};
    link.outbuf.append(reinterpret_cast<const char*>(&h), sizeof(h));
    link.outbuf += selfKey;
    sendQueued(link);
  }
  runtime_.poke();  // watch the new link from the next round on
  return id;
}

void ProcessLinks::send(int link, uint64_t dstNonce, uint64_t srcNonce, int srcRank, uint16_t type,
                        const std::string& text, bool droppable) {
  bool backlog;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = links_.find(link);
    if (it == links_.end() || !it->second->open) return;
    Link& l = *it->second;
    if (droppable && !l.outbuf.empty()) return;  // it has not even taken the last one
    const std::string body = text.substr(0, kMaxText);
    if (l.outbuf.size() + sizeof(RecordHead) + body.size() > kMaxQueued) return;
    RecordHead h{kLinkMagic, type, static_cast<uint16_t>(body.size()), srcRank, 0, dstNonce, srcNonce};
    l.outbuf.append(reinterpret_cast<const char*>(&h), sizeof(h));
    l.outbuf += body;
    sendQueued(l);
    backlog = !l.outbuf.empty();
  }
  if (backlog) runtime_.poke();  // the rest goes when the socket polls writable
}

void ProcessLinks::flush(int link, std::chrono::milliseconds bound) {
  const auto until = Clock::now() + bound;
  for (;;) {
    int fd;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = links_.find(link);
      if (it == links_.end() || !it->second->open) return;
      sendQueued(*it->second);
      if (it->second->outbuf.empty()) return;
      fd = it->second->fd;
    }
    if (Clock::now() >= until) return;  // the peer may be hung
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, 10);
  }
}

void ProcessLinks::open(uint64_t nonce) {
  std::lock_guard<std::mutex> g(mu_);
  auto& box = inbox_[nonce];
  if (auto it = parked_.find(nonce); it != parked_.end()) {
    for (auto& [n, r] : it->second.records) box.push_back(std::move(r));
    parked_.erase(it);
  }
}

void ProcessLinks::close(uint64_t nonce) {
  std::lock_guard<std::mutex> g(mu_);
  inbox_.erase(nonce);
  parked_.erase(nonce);
  closed_.insert(nonce);
}

std::vector<LinkRecord> ProcessLinks::take(uint64_t nonce) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = inbox_.find(nonce);
  if (it == inbox_.end()) return {};
  return std::exchange(it->second, {});
}

void ProcessLinks::readNow() {
  std::lock_guard<std::mutex> g(mu_);
  adoptArrivals();
  for (auto& [id, l] : links_)
    if (l->open) readLink(*l);
}

bool ProcessLinks::isOpen(int link, int* err, bool* corrupted) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = links_.find(link);
  if (it == links_.end()) return false;
  *err = it->second->err;
  *corrupted = it->second->corrupted;
  return it->second->open;
}

uint64_t ProcessLinks::closures() const {
  std::lock_guard<std::mutex> g(mu_);
  return closures_;
}

size_t ProcessLinks::openLinks() const {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<size_t>(std::count_if(links_.begin(), links_.end(), [](const auto& e) { return e.second->open; }));
}

void ProcessLinks::adoptArrivals() {
  for (Arrival& a : mailbox_->takeAll()) {
    if (a.kind != LinkKind::Process) continue;  // closed as `a` goes
    auto l = std::make_unique<Link>();
    l->id = nextId_++;
    tuneSocket(a.fd.get());
    setNonBlocking(a.fd.get(), true);
    l->fd = a.fd.release();
    links_.emplace(l->id, std::move(l));
  }
}

void ProcessLinks::readLink(Link& l) {
  char buf[4096];
  bool closed = false;
  int err = 0;
  for (;;) {
    const ssize_t n = recv(l.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      l.inbuf.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    closed = true;  // EOF or a reset: the process on the other end is gone
    err = n == 0 ? 0 : errno;
    break;
  }
  // The records first: a group leaving on purpose sends BYE, and its process
  // may exit right after; both arrive before this thread runs.
  parse(l);
  if (closed && l.open) closeLink(l, err, false);
}

void ProcessLinks::parse(Link& l) {
  size_t at = 0;
  while (l.open && l.inbuf.size() - at >= sizeof(RecordHead)) {
    RecordHead h;
    std::memcpy(&h, l.inbuf.data() + at, sizeof(h));
    if (h.magic != kLinkMagic || h.len > kMaxText) {
      closeLink(l, 0, true);
      return;
    }
    if (l.inbuf.size() - at < sizeof(h) + h.len) break;  // the rest is still on its way
    std::string text = l.inbuf.substr(at + sizeof(h), h.len);
    at += sizeof(h) + h.len;
    if (h.type == kIdentity) {
      l.key = text;
      sendOn_.emplace(text, l.id);  // an accepted link carries this side's records too, if it is the first
      identified_.notify_all();
    } else {
      keep(h.dstNonce, LinkRecord{h.type, h.srcRank, h.srcNonce, l.id, std::move(text)});
    }
  }
  l.inbuf.erase(0, at);
}

void ProcessLinks::keep(uint64_t nonce, LinkRecord r) {
  if (closed_.count(nonce)) return;  // a group this process closed
  if (auto it = inbox_.find(nonce); it != inbox_.end()) {
    it->second.push_back(std::move(r));
    return;
  }
  auto [it, fresh] = parked_.try_emplace(nonce);
  Parked& p = it->second;
  if (fresh) p.since = Clock::now();
  const size_t beats = static_cast<size_t>(std::count_if(
      p.records.begin(), p.records.end(), [](const auto& e) { return e.second.type == kHeartbeatType; }));
  if (p.records.size() >= kMaxParkedRecords || (r.type == kHeartbeatType && beats >= kMaxParkedHeartbeats)) return;
  p.records.emplace_back(nonce, std::move(r));
}

void ProcessLinks::closeLink(Link& l, int err, bool corrupted) {
  if (!l.open) return;
  l.open = false;
  l.err = err;
  l.corrupted = corrupted;
  ::close(l.fd);
  l.fd = -1;
  l.inbuf.clear();
  l.outbuf.clear();
  if (auto it = sendOn_.find(l.key); it != sendOn_.end() && it->second == l.id) sendOn_.erase(it);
  closures_++;
}

void ProcessLinks::sendQueued(Link& l) {
  while (l.open && !l.outbuf.empty()) {
    const ssize_t n = ::send(l.fd, l.outbuf.data(), l.outbuf.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) break;  // full (retried on POLLOUT) or broken (the read side reports it)
    l.outbuf.erase(0, static_cast<size_t>(n));
  }
}

Clock::time_point ProcessLinks::tick(Clock::time_point now) {
  std::lock_guard<std::mutex> g(mu_);
  adoptArrivals();
  if (now >= nextParkCheck_) {
    nextParkCheck_ = now + std::chrono::seconds(1);
    for (auto it = parked_.begin(); it != parked_.end();)
      it = now - it->second.since > kParkLimit ? parked_.erase(it) : std::next(it);
  }
  return nextParkCheck_;
}

void ProcessLinks::addPollFds(std::vector<pollfd>& fds) {
  std::lock_guard<std::mutex> g(mu_);
  polledLinks_.clear();
  fds.push_back({mailbox_->fd(), POLLIN, 0});
  for (auto& [id, l] : links_) {
    if (!l->open) continue;
    fds.push_back({l->fd, static_cast<short>(POLLIN | (l->outbuf.empty() ? 0 : POLLOUT)), 0});
    polledLinks_.push_back(id);
  }
}

void ProcessLinks::polled(const pollfd* fds, size_t n) {
  std::lock_guard<std::mutex> g(mu_);
  if (n > 0 && fds[0].revents) adoptArrivals();
  for (size_t k = 1; k < n && k - 1 < polledLinks_.size(); ++k) {
    auto it = links_.find(polledLinks_[k - 1]);
    if (it == links_.end() || !it->second->open) continue;
    if (fds[k].revents & POLLOUT) sendQueued(*it->second);
    if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) readLink(*it->second);
  }
}

}  // namespace roce
