#include "connection_manager.hpp"

#include <cstdint>
#include <poll.h>

#include <cerrno>
#include <cstring>

#include "../common/error.hpp"
#include "../common/log.hpp"

namespace roce::comm {
namespace {
// How often a busy wait looks at the sockets (accepts, dials): rarely enough
// that a spinning small collective pays ~1% for it, often enough that a peer's
// connection is answered within a fraction of its round trip budget. A blocked
// wait polls the descriptors and is woken at once.
constexpr auto kServiceEvery = std::chrono::microseconds(100);
// One connect() attempt; an unroutable address is retried after this.
constexpr auto kConnectAttempt = std::chrono::seconds(5);
constexpr auto kRetryFirst = std::chrono::milliseconds(20);
constexpr auto kRetryMax = std::chrono::milliseconds(1000);
// How long a group waits for another group's dial to the same process
// before it dials itself (and how old a claim must be for a new group to
// take it over: TcpMux::firstContact). A dial to a live process takes
// milliseconds on an idle machine, but its answer comes from the peer
// group's thread, which a loaded machine may run late. One that takes
// longer (the peer's group there does not exist yet, or the dialing group
// broke and no longer drives its dial) then costs this group up to this
// long and a second socket, never a hang.
constexpr auto kSharedDialWait = std::chrono::seconds(5);

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

struct ConnectionManager::Dial {
  enum Phase { Waiting, Connecting, AwaitReply };
  Phase phase = Waiting;  // Waiting: the next attempt starts at retryAt
  UniqueFd fd;
  Clock::time_point since = Clock::now();
  Clock::time_point attemptStart{};
  Clock::time_point retryAt{};
  std::chrono::milliseconds backoff = kRetryFirst;
  int attempts = 0;
  std::string lastError;
};

ConnectionManager::ConnectionManager(int rank, std::string transport, const std::vector<TcpEndpoint>& endpoints,
                                     const std::vector<std::string>& hostNames, const std::vector<uint64_t>& nonces,
                                     std::unique_ptr<TcpAcceptor> acceptor, Connected connected, Failed failed,
                                     Counters& counters)
    : rank_(rank),
      transport_(std::move(transport)),
      endpoints_(endpoints),
      hostNames_(hostNames),
      nonces_(nonces),
      acceptor_(std::move(acceptor)),
      onConnected_(std::move(connected)),
      onFailed_(std::move(failed)),
      counters_(counters) {}

ConnectionManager::~ConnectionManager() = default;

void ConnectionManager::want(int peer) {
  if (connected_.count(peer) || dials_.count(peer) || awaiting_.count(peer) || deferred_.count(peer)) return;
  if (shared_.turn) {
    switch (shared_.turn(peer)) {
      case FirstContact::Linked:
        shared_.linked(peer);
        return;
      case FirstContact::Wait:
        deferred_[peer] = Clock::now();
        return;
      case FirstContact::Dial:
        break;
    }
  }
  dial(peer);
}

void ConnectionManager::dial(int peer) {
  auto& d = dials_[peer];
  d = std::make_unique<Dial>();
  startDial(peer, *d);
}

bool ConnectionManager::advanceDeferred(Clock::time_point now) {
  bool moved = false;
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    const int peer = it->first;
    const auto turn = shared_.turn(peer);
    if (turn == FirstContact::Wait && now - it->second < kSharedDialWait) {
      ++it;
      continue;
    }
    it = deferred_.erase(it);
    moved = true;
    if (turn == FirstContact::Linked) shared_.linked(peer);
    else dial(peer);  // claimed, or waited long enough
  }
  return moved;
}

void ConnectionManager::startDial(int peer, Dial& d) {
  d.fd = runtime::startDial(endpoints_.at(peer), peer);
  d.phase = Dial::Connecting;
  d.attemptStart = Clock::now();
  d.attempts++;
}

void ConnectionManager::accepted(int peer, UniqueFd fd, bool ourDial) {
  // Which side's dial made the connection: with ROCE_PG_DEBUG=TRACE, who
  // connected to whom and when (a peer's first operation dials this rank).
  ROCE_TRACE("rank ", rank_, ": ", transport_, " connection with rank ", peer, " made by ",
             ourDial ? "this rank's dial" : "the peer's dial", " (", connected_.size() + 1,
             " peer(s) connected)");
  tuneSocket(fd.get());
  connected_.insert(peer);
  awaiting_.erase(peer);
  deferred_.erase(peer);  // the peer's dial came first
  Counters::add(counters_.connections, 1);
  // After the transport adopted it (waiters then find it), also if adopting threw.
  struct EndClaim {
    const SharedDials& s;
    int peer;
    ~EndClaim() {
      if (s.ended) s.ended(peer);
    }
  } endClaim{shared_, peer};
  onConnected_(peer, std::move(fd));
}

void ConnectionManager::onIncoming(int peer, UniqueFd fd) {
  auto d = dials_.find(peer);
  // Our own dial counts while it is actually in flight; one waiting to retry
  // (the peer was unreachable from here) yields to the peer's working one.
  const bool dialing = d != dials_.end() && d->second->phase != Dial::Waiting;
  if (connected_.count(peer) || (dialing && rank_ < peer)) {
    // A duplicate, or our dial wins the tie: the peer accepts ours instead.
    sendReply(fd.get(), HelloReply::Superseded);
    return;
  }
  if (!sendReply(fd.get(), HelloReply::Accepted)) return;  // gone already: it dials again or is reported dead
  if (d != dials_.end()) dials_.erase(d);  // the lower rank's dial won; the peer drops ours
  accepted(peer, std::move(fd), /*ourDial=*/false);
}

void ConnectionManager::refused(int peer) {
  const std::string why =
      str("rank ", peer, " (host ", hostNames_.at(peer), ", ", endpoints_.at(peer).host, ":", endpoints_.at(peer).port,
          ") refused the ", transport_, " connection from rank ", rank_,
          ": its process exited or destroyed the process group");
  dials_.erase(peer);
  if (shared_.ended) shared_.ended(peer);  // a waiting group dials and learns it itself
  onFailed_(peer, why);
}

bool ConnectionManager::advanceDial(int peer, Dial& d, Clock::time_point now) {
  auto retry = [&](std::string why) {
    // A dial that must try again gives up its claim: groups waiting for it
    // dial at once rather than wait for this one's backoff.
    if (shared_.ended) shared_.ended(peer);
    d.lastError = std::move(why);
    d.fd = UniqueFd();
    d.phase = Dial::Waiting;
    d.retryAt = now + d.backoff;
    d.backoff = std::min(d.backoff * 2, kRetryMax);
    return true;
  };
  switch (d.phase) {
    case Dial::Waiting:
      if (now < d.retryAt) return false;
      startDial(peer, d);
      return true;
    case Dial::Connecting: {
      pollfd p{d.fd.get(), POLLOUT, 0};
      if (poll(&p, 1, 0) <= 0) {
        if (now - d.attemptStart > kConnectAttempt) return retry("connect() took longer than 5 s");
        return false;
      }
      const int err = connectResult(d.fd.get());
      if (err == ECONNREFUSED) {
        // Every process's listener is open before the roster exists and
        // stays open for its life: a refusal means the peer's process is gone.
        refused(peer);  // `d` is gone from here on
        return true;
      }
      if (err != 0) return retry(std::strerror(err));
      if (!sendHello(d.fd.get(), LinkKind::Mesh, rank_, peer, nonces_.at(rank_), nonces_.at(peer))) return retry("the connection closed at once");
      d.phase = Dial::AwaitReply;
      return true;
    }
    case Dial::AwaitReply: {
      std::optional<HelloReply> reply;
      try {
        reply = readReply(d.fd.get(), peer);
      } catch (const Error& e) {
        return retry(e.what());  // a refusal on the next attempt tells a dead peer apart
      }
      if (!reply) return false;
      if (*reply == HelloReply::Gone) {  // the process lives, the group there does not
        refused(peer);
        return true;
      }
      UniqueFd fd = std::move(d.fd);
      dials_.erase(peer);
      if (*reply == HelloReply::Accepted) accepted(peer, std::move(fd), /*ourDial=*/true);
      else awaiting_[peer] = now;  // the peer's own dial reaches our acceptor
      return true;
    }
  }
  return false;
}

bool ConnectionManager::progress(bool now) {
  const auto t = Clock::now();
  // Peers waiting for another group's dial first, every time: no descriptor
  // of this group announces that group's new connection (its adoption only
  // writes the wake-up), so a wait's last look before it sleeps must see it.
  bool moved = !deferred_.empty() && advanceDeferred(t);
  if (!now && t < nextService_) return moved;
  nextService_ = t + kServiceEvery;
  acceptor_->service();
  while (auto c = acceptor_->takeAny(LinkKind::Mesh)) {
    onIncoming(c->first, std::move(c->second));
    moved = true;
  }
  std::vector<int> peers;
  peers.reserve(dials_.size());
  for (auto& [peer, d] : dials_) peers.push_back(peer);
  for (int peer : peers) {
    auto it = dials_.find(peer);
    if (it != dials_.end()) moved |= advanceDial(peer, *it->second, t);
  }
  return moved;
}

void ConnectionManager::addPollFds(std::vector<pollfd>& fds) const {
  acceptor_->addPollFds(fds);
  for (const auto& [peer, d] : dials_) {
    if (d->phase == Dial::Connecting) fds.push_back({d->fd.get(), POLLOUT, 0});
    if (d->phase == Dial::AwaitReply) fds.push_back({d->fd.get(), POLLIN, 0});
  }
}

std::string ConnectionManager::status(int peer) const {
  if (connected_.count(peer)) return "";
  if (auto it = dials_.find(peer); it != dials_.end()) {
    const Dial& d = *it->second;
    return str("the ", transport_, " connection from rank ", rank_, " to rank ", peer, " (host ", hostNames_.at(peer), ", ",
               endpoints_.at(peer).host, ":", endpoints_.at(peer).port, ") is not established after ",
               secondsSince(d.since), " s and ", d.attempts, " attempt(s)",
               d.lastError.empty() ? std::string() : str("; last error: ", d.lastError),
               ". Check that the address is reachable from this machine, or set ROCE_PG_SOCKET_IFNAME");
  }
  if (auto it = deferred_.find(peer); it != deferred_.end())
    return str("another process group of this process is connecting to the process of rank ", peer, " (host ",
               hostNames_.at(peer), "), for ", secondsSince(it->second), " s");
  if (auto it = awaiting_.find(peer); it != awaiting_.end())
    return str("rank ", peer, " has not completed its connection to rank ", rank_, " (", secondsSince(it->second),
               " s after it won the tie between their dials)");
  return str("rank ", peer, " has not connected to rank ", rank_, " yet");
}

}  // namespace roce::comm
