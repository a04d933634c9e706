#include "front_desk.hpp"

#include <arpa/inet.h>
#include <cstdint>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../common/error.hpp"
#include "../common/job_secret.hpp"
#include "../common/log.hpp"
#include "../common/sockets.hpp"
#include "connect.hpp"

namespace roce::runtime {
namespace {
// A dialer sends its first bytes right after connect(); one that has not
// after this long is not one of ours (or is hopelessly overloaded) and is dropped.
constexpr auto kHeadDeadline = std::chrono::seconds(30);
// Half-open connections the desk keeps at once (NetworkBudgets::
// pendingHeads); more are closed unread (a port scan or a runaway client
// must not eat the descriptors). Of those, from one source address
// (pendingHeadsPerSource): someone who opens connections and sends nothing
// (a slowloris) holds at most these, and the others' dials still get a slot.
// A machine's ranks dial heads that arrive within microseconds.
// After the process ran out of descriptors (EMFILE), the listener is not
// polled for this long: it stays readable, and accepting again at once would spin.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// Peers on this machine dial here (group/group_builder.cpp).
const std::string kLoopback = kLoopbackAddress;
// Ports tried for one that is free on the advertised address and loopback alike.
constexpr int kPortAttempts = 16;
// How long a hello for a key nobody opened yet is kept (a subgroup member that
// is this late to create the group has timed out its peers anyway: torch's
// default timeout is 10 to 30 minutes).
constexpr auto kParkLimit = std::chrono::minutes(30);
constexpr size_t kMaxParked = 4096;
}  // namespace

Mailbox::Mailbox() : efd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (efd_ < 0) throwComm(str("eventfd() for a group's mailbox failed: ", std::strerror(errno),
                              " (out of file descriptors? `ulimit -n`)"));
}

Mailbox::~Mailbox() {
  if (efd_ >= 0) ::close(efd_);
}

std::vector<Arrival> Mailbox::takeAll() {
  std::lock_guard<std::mutex> g(mu_);
  if (efd_ >= 0) {
    uint64_t v;
    (void)!read(efd_, &v, sizeof(v));
  }
  pending_.store(false);
  return std::exchange(items_, {});
}

void Mailbox::wait(int ms) {
  std::unique_lock<std::mutex> g(mu_);
  arrived_.wait_for(g, std::chrono::milliseconds(ms), [&] { return !items_.empty(); });
}

void Mailbox::useWaker(std::function<void()> waker) {
  std::lock_guard<std::mutex> g(mu_);
  if (efd_ >= 0) ::close(efd_.exchange(-1));
  waker_ = std::move(waker);
  if (waker_ && !items_.empty()) waker_();  // delivered while the owner still watched the descriptor
}

void Mailbox::deliver(Arrival a) {
  std::lock_guard<std::mutex> g(mu_);
  items_.push_back(std::move(a));
  pending_.store(true);  // before the wake-up: a waiter that announced its sleep sees one or the other
  if (efd_ >= 0) {
    uint64_t one = 1;
    (void)!write(efd_, &one, sizeof(one));
  } else if (waker_) {
    waker_();
  }
  arrived_.notify_all();
}

struct FrontDesk::Pending {
  UniqueFd fd;
  uint32_t source = 0;  // the dialer's IPv4 address (network order)
  Clock::time_point since = Clock::now();
  char buf[sizeof(Signed<Hello>)];
  size_t got = 0;
};

namespace {

// The bytes of the head in `buf` (`got` read so far): a join header or a
// hello, with the MAC that follows one of the current version.
size_t headBytes(const char* buf, size_t got) {
  if (got < sizeof(uint32_t) + sizeof(uint16_t)) return sizeof(JoinHeader);
  uint32_t magic;
  uint16_t version;
  std::memcpy(&magic, buf, sizeof(magic));
  std::memcpy(&version, buf + sizeof(magic), sizeof(version));
  if (magic == kHelloMagic) return version == kHelloVersion ? sizeof(Signed<Hello>) : sizeof(Hello);
  return version == kJoinVersion ? sizeof(Signed<JoinHeader>) : sizeof(JoinHeader);
}

}  // namespace

FrontDesk::FrontDesk(ProcessRuntime& runtime) : runtime_(runtime), budgets_(NetworkBudgets::get()) {}
FrontDesk::~FrontDesk() = default;

int FrontDesk::port() const {
  std::lock_guard<std::mutex> g(mu_);
  return listeners_.empty() ? 0 : listeners_.front()->port();
}

std::unique_ptr<TcpListener> FrontDesk::listenOn(const std::string& address, int port) {
  int err = 0;
  auto l = TcpListener::open(address, port, err);
  if (!l && !(port != 0 && err == EADDRINUSE))
    throwComm(str("could not listen on ", address, ":", port, ": ", std::strerror(err),
                  err == EADDRNOTAVAIL ? " (not an address of this machine: check ROCE_PG_SOCKET_IFNAME)" : ""));
  return l;
}

int FrontDesk::listen(const std::string& advertised) {
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& l : listeners_)
      if (l->address() == advertised) return l->port();
    std::vector<std::string> addresses{advertised};
    if (advertised != kLoopback) addresses.push_back(kLoopback);
    if (listeners_.empty()) {
      // One port on every address: the first listener's, which the others
      // may find taken (another process's): then another first port.
      for (int attempt = 0; attempt < kPortAttempts && listeners_.empty(); ++attempt) {
        std::vector<std::unique_ptr<TcpListener>> opened;
        opened.push_back(listenOn(addresses[0], 0));
        for (size_t i = 1; i < addresses.size() && opened.back(); ++i)
          opened.push_back(listenOn(addresses[i], opened.front()->port()));
        if (opened.back()) listeners_ = std::move(opened);
      }
      if (listeners_.empty())
        throwComm(str("could not listen on ", advertised, " and ", kLoopback, " with one port in ", kPortAttempts,
                      " tries: every port the kernel picked on ", advertised, " was taken on ", kLoopback));
    } else {
      // Peers know a process by its address (ProcessLinks::processKey): a
      // group advertising another would be another process to them.
      throwInvalid(str("this process's groups advertise ", listeners_.front()->address(), ", and a new group ",
                       advertised, ": give every group of a process the same ROCE_PG_SOCKET_IFNAME"));
    }
  }
  runtime_.poke();  // poll the new listeners from now on
  return port();
}

std::shared_ptr<Mailbox> FrontDesk::open(uint64_t key) {
  auto box = std::make_shared<Mailbox>();
  std::lock_guard<std::mutex> g(mu_);
  if (closed_.count(key) || !boxes_.emplace(key, box).second)
    throwComm(str("a process group of this process already used the key ", key,
                  " (a subgroup created twice under one name, or two random nonces that collided: retry)"));
  // Hellos that came before the group did.
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->key == key) {
      box->deliver(std::move(it->arrival));
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  return box;
}

void FrontDesk::close(uint64_t key) {
  std::lock_guard<std::mutex> g(mu_);
  boxes_.erase(key);
  closed_.insert(key);
}

size_t FrontDesk::parked() const {
  std::lock_guard<std::mutex> g(mu_);
  return parked_.size();
}

bool FrontDesk::wasClosed(uint64_t key) const {
  std::lock_guard<std::mutex> g(mu_);
  return closed_.count(key) > 0;
}

size_t FrontDesk::openMailboxes() const {
  std::lock_guard<std::mutex> g(mu_);
  return boxes_.size();
}

template <class Done>
void FrontDesk::dropPending(Done done) {
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](auto& p) {
                                  if (!done(*p)) return false;
                                  if (auto it = pendingBySource_.find(p->source); it != pendingBySource_.end() &&
                                                                                  --it->second == 0)
                                    pendingBySource_.erase(it);
                                  return true;
                                }),
                 pending_.end());
  pendingCount_ = pending_.size();
}

Clock::time_point FrontDesk::tick(Clock::time_point now) {
  // Dialers that never spoke: dropped (the socket closes with the entry).
  dropPending([&](const Pending& p) { return now - p.since > kHeadDeadline; });
  // Parked hellos whose dialer hung up (or that waited too long). Not polled
  // for input: a parked connection may keep receiving, which would wake
  // every round. Once a second, a zero-timeout poll for the hang-up itself
  // (POLLRDHUP: also when unread bytes sit in front of the EOF).
  if (now >= nextParkCheck_) {
    nextParkCheck_ = now + std::chrono::seconds(1);
    std::lock_guard<std::mutex> g(mu_);
    parked_.erase(std::remove_if(parked_.begin(), parked_.end(),
                                 [&](const Parked& p) {
                                   pollfd q{p.arrival.fd.get(), POLLRDHUP, 0};
                                   const bool gone = poll(&q, 1, 0) > 0 && (q.revents & (POLLRDHUP | POLLHUP | POLLERR));
                                   return gone || now - p.since > kParkLimit;
                                 }),
                  parked_.end());
  }
  const Clock::time_point next = std::min(now + std::chrono::seconds(1), nextParkCheck_);
  return acceptPausedUntil_ > now ? std::min(next, acceptPausedUntil_) : next;
}

void FrontDesk::addPollFds(std::vector<pollfd>& fds) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (Clock::now() >= acceptPausedUntil_)
      for (const auto& l : listeners_) fds.push_back({l->fd(), POLLIN, 0});
  }
  for (const auto& p : pending_) fds.push_back({p->fd.get(), POLLIN, 0});
}

void FrontDesk::polled(const pollfd* fds, size_t n) {
  // Entries follow addPollFds' order: the listeners, then pending_ as it
  // was, which only this thread changes.
  bool anyReady = false;
  for (size_t i = 0; i < n; ++i) anyReady |= fds[i].revents != 0;
  if (!anyReady) return;
  if (Clock::now() >= acceptPausedUntil_) acceptNew();
  dropPending([&](Pending& p) { return readHead(p); });
}

void FrontDesk::acceptNew() {
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& l : listeners_) fds.push_back(l->fd());
  }
  for (int lfd : fds)
    if (!acceptFrom(lfd)) return;
}

bool FrontDesk::acceptFrom(int lfd) {
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof(from);
    UniqueFd fd(accept4(lfd, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.get() < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        acceptPausedUntil_ = Clock::now() + kAcceptPause;
        if (!outOfDescriptorsLogged_) {
          outOfDescriptorsLogged_ = true;
          ROCE_WARN("roce: the listener cannot accept connections: ", std::strerror(errno),
                    "; accepting pauses for 100 ms at a time until descriptors free up (raise `ulimit -n`)");
        }
        return false;
      }
      return true;  // EAGAIN: nothing more right now
    }
    int& fromSource = pendingBySource_[from.sin_addr.s_addr];
    if (pending_.size() >= budgets_.pendingHeads || static_cast<size_t>(fromSource) >= budgets_.pendingHeadsPerSource) {
      if (fromSource == 0) pendingBySource_.erase(from.sin_addr.s_addr);
      refusedBusy_.fetch_add(1);
      continue;  // closed unread
    }
    ++fromSource;
    auto p = std::make_unique<Pending>();
    p->fd = std::move(fd);
    p->source = from.sin_addr.s_addr;
    pending_.push_back(std::move(p));
    pendingCount_ = pending_.size();
  }
}

bool FrontDesk::readHead(Pending& p) {
  // Read exactly the head: what follows (a join's rank info, a data stream)
  // stays in the socket for the mailbox's owner.
  for (;;) {
    const size_t need = headBytes(p.buf, p.got);
    if (p.got >= need) break;
    const ssize_t r = recv(p.fd.get(), p.buf + p.got, need - p.got, MSG_DONTWAIT);
    if (r > 0) {
      p.got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    return true;  // closed before its head: a probe (refusesConnections) or a client that gave up
  }
  uint32_t magic;
  std::memcpy(&magic, p.buf, sizeof(magic));
  if (magic != kHelloMagic && magic != kJoinMagic) return true;  // not roce's: dropped
  const size_t head = magic == kHelloMagic ? sizeof(Hello) : sizeof(JoinHeader);
  const bool signedHead = p.got > head;  // the current version's, MAC after it
  if (signedHead && !JobSecret::verify(p.buf, head, reinterpret_cast<const uint8_t*>(p.buf + head))) {
    refuseUnauthenticated(p);
    return true;
  }
  if (magic == kHelloMagic) {
    Hello h;
    std::memcpy(&h, p.buf, sizeof(h));
    if (!signedHead) {
      // Another roce_pg version: told which this one runs (a dial waiting
      // for an answer names both), and said here once.
      sendVersionReply(p.fd.get());
      if (otherVersions_.fetch_add(1) == 0)
        ROCE_WARN("roce: a connection from ", peerAddress(p.fd.get()), " speaks connection protocol ", h.version,
                  "; this process runs ", kHelloVersion, ": install the same roce_pg on every machine");
      return true;
    }
    Arrival a{static_cast<LinkKind>(h.kind), h.src, h.dst, h.srcNonce, std::move(p.fd), {}};
    route(h.dstNonce, std::move(a));
  } else {
    // A join of another version goes on unsigned: its leader answers it with
    // the versions (group/join.cpp), which is all it gets.
    JoinHeader h;
    std::memcpy(&h, p.buf, sizeof(h));
    Arrival a{LinkKind::Join, h.rank, 0, 0, std::move(p.fd), std::string(p.buf, sizeof(h))};
    route(h.leaderNonce, std::move(a));
  }
  return true;
}

void FrontDesk::refuseUnauthenticated(const Pending& p) {
  // Logged once per process: a stranger may dial again and again.
  if (unauthenticated_.fetch_add(1) == 0)
    ROCE_WARN("roce: closed a connection from ", peerAddress(p.fd.get()), " whose head was not signed with "
              "this job's secret: a process of another job, someone who is not a rank, or ranks whose "
              "ROCE_PG_JOB_SECRET differs (later ones are only counted: connections_unauthenticated)");
}

void FrontDesk::route(uint64_t key, Arrival a) {
  std::lock_guard<std::mutex> g(mu_);  // with open(): a hello is delivered or parked, never lost
  if (a.kind == LinkKind::Probe) {
    sendReply(a.fd.get(), closed_.count(key) ? HelloReply::Gone : HelloReply::Accepted);
    return;
  }
  if (auto it = boxes_.find(key); it != boxes_.end()) {
    it->second->deliver(std::move(a));
    return;
  }
  if (a.kind == LinkKind::Join) return;  // a stale leader record: closing says so
  if (closed_.count(key)) {
    // A destroyed group's: the dialer must stop (a data dial waits for an
    // answer, so it gets one).
    if (a.kind == LinkKind::Mesh) sendReply(a.fd.get(), HelloReply::Gone);
    return;
  }
  if (parked_.size() < kMaxParked) parked_.push_back({key, std::move(a), Clock::now()});
}

}  // namespace roce::runtime
