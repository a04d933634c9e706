// THE wait loop of the group's progress thread: progress every transport and
// the connections; when nothing moves, spin briefly, then block on the
// descriptors that announce progress (or back off where none can); and the
// checks every wait makes (deadline, abort, peers reported dead).
#include <cstdint>
#include <poll.h>

#include <cerrno>

#include "../common/error.hpp"
#include "../common/spin.hpp"
#include "communicator.hpp"
#include "connection_manager.hpp"
#include "../liveness/lifeline.hpp"
#include "../liveness/verdict.hpp"

namespace roce::comm {
using namespace roce::liveness;

void Communicator::checkDeadline(const std::function<std::string()>& waitingFor) {
  // Watched peers that left or died: their requests fail here, on the thread
  // that owns the transports (an atomic load when there is no news).
  if (peersGone_.load(std::memory_order_relaxed)) failGonePeers();
  if (abortRequested_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> g(abortMu_);
    throw Error(ErrorKind::Aborted, str("roce: ", opName(), " on rank ", rank(), " was aborted: ", abortReason_));
  }
  if (peerFailed_.load(std::memory_order_relaxed)) throwIfPeerFailed(opName());  // names only when needed
  if (Clock::now() >= deadline_) {
    auto total = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count();
    const std::string v = verdict();
    throwTimeout(str(opName(), " on rank ", rank(), " timed out (group timeout ", total, " ms) waiting for ",
                     waitingFor(), ". That rank may have crashed, hung, or called a different "
                     "collective (every rank must issue the same collectives in the same order)",
                     v.empty() ? "" : str(". Verdict from every rank's last collective: ", v)));
  }
}

void Communicator::throwIfPeerFailed(const std::string& what) {
  if (!peerFailed_.load(std::memory_order_relaxed)) return;
  std::string why;
  {
    std::lock_guard<std::mutex> g(abortMu_);
    if (Clock::now() - peerFailedAt_ >= kPeerFailureGrace) why = peerFailure_;
  }
  // A rank that timed out put its verdict into the notice, so this error
  // names the same culprit; a dead rank is named by the notice itself.
  if (!why.empty()) throwComm(str(what, " on rank ", rank(), " stopped: ", why));
}

std::string Communicator::verdict() {
  if (!lifeline_ || size() < 2) return "";
  return formatVerdict(lifeline_->collectStates(size(), Clock::now() + kVerdictWait), size());
}

void Communicator::checkHealth() {
  if (peersGone_.load(std::memory_order_relaxed)) failGonePeers();
  throwIfPeerFailed("point-to-point operation");
  if (Clock::now() - lastSlowCheck_ > kSlowCheckEvery) {
    lastSlowCheck_ = Clock::now();
    opWhat_ = nullptr;
    opName_ = "point-to-point operation";
    slowChecks();
  }
}

void Communicator::checkTaskDeadline(const std::string& what, Clock::time_point deadline,
                                     std::chrono::milliseconds timeout) {
  if (Clock::now() < deadline) return;
  auto total = timeout.count();
  throwTimeout(str(what, " on rank ", rank(), " timed out (timeout ", total, " ms) waiting for its peer. "
                   "That rank may have crashed, hung, or not posted the matching send/receive"));
}

void Communicator::slowChecks() {
  // A dead connection fails the requests that use it, and so the waits on them;
  // it does not fail operations that no longer need that peer. A rank that
  // left gracefully (destroyed the group after its last message) closes its
  // connections while others may still finish with third ranks; a rank that
  // died is reported by the lifelines (csrc/liveness/lifeline.hpp) to everyone.
  for (auto& t : transports_) t->checkPeers();
}

void Communicator::waitUntil(const std::function<bool()>& done, const std::function<std::string()>& waitingFor,
                             const std::function<void()>& block) {
  IdleWait idle;
  uint64_t rounds = 0;
  for (;;) {
    helperEventsSeen_ = helperEvents_.load(std::memory_order_acquire);  // before done() looks at the helpers
    if (done()) break;
    bool slow = false;  // this round waited long enough for the slow checks
    if (progress()) {
      idle.moved();
    } else if (block) {
      block();
      slow = true;
    } else {
      slow = idleRound(idle);
      if (slow && idleHook) idleHook();  // async work may have finished meanwhile
    }
    checkDeadline(waitingFor);
    if ((++rounds & 63) == 0 && idleHook) idleHook();
    if (slow && Clock::now() - lastSlowCheck_ > kSlowCheckEvery) {
      lastSlowCheck_ = Clock::now();
      slowChecks();
    }
  }
}

bool Communicator::idleRound(IdleWait& w, const std::function<bool()>& interrupt) {
  if (!w.idle) {
    w.idle = true;
    w.since = Clock::now();
    return false;
  }
  if (Clock::now() - w.since < std::chrono::microseconds(cfg_.spinUs)) {
    cpuRelax();
    return false;
  }
  switch (blockUntilActivity(interrupt)) {
    case Blocked::Moved:  // the re-check found work: the next idle stretch spins again
      w.moved();
      return false;
    case Blocked::Slept:
      return true;
    case Blocked::Cannot:
      break;
  }
  // Pending shared-memory traffic, which no descriptor announces (no usable
  // doorbell, shm/doorbell.hpp): the spin
  // budget is spent, so yield, then sleep briefly (a spinning rank would take
  // the core from the local peer it waits for).
  w.backoff.skipSpins();
  w.backoff.pause();
  return w.backoff.sleeping();
}

Communicator::Blocked Communicator::blockUntilActivity(const std::function<bool()>& interrupt) {
  if (!wakeup_.valid()) return Blocked::Cannot;
  waitFds_.clear();
  waitFds_.push_back(pollfd{wakeup_.fd(), POLLIN, 0});
  if (extraWaitFd_ >= 0) waitFds_.push_back(pollfd{extraWaitFd_, POLLIN, 0});
  // Announced before the transports prepare: a waker that acts while they do
  // (the runtime thread forwarding a verbs completion event, which a CQ
  // armed just before may raise at once) must find the announcement and
  // write. Withdrawn on every exit, a throw from progress() included: an
  // announcement left standing would keep the eventfd set for good
  // (Wakeup clears it only when no waiter is left), and every later wait of
  // the group would spin.
  Wakeup::Announcement announced(wakeup_);
  // A transport that prepared may have announced the sleep to its peers (the
  // shared-memory doorbell): every exit below, a throw included, ends its
  // wait with afterWait().
  struct EndWait {
    std::vector<std::unique_ptr<Transport>>& ts;
    size_t prepared = 0;
    ~EndWait() {
      for (size_t i = 0; i < prepared; ++i) ts[i]->afterWait();
    }
  } endWait{transports_};
  for (auto& t : transports_) {
    if (!t->prepareWait(waitFds_, !anySource_.empty())) return Blocked::Cannot;
    ++endWait.prepared;
  }
  if (connections_) connections_->addPollFds(waitFds_);
  // What arrived before the transports armed their notifications (and before
  // the doorbell's announcement) raises no event: look once more. Then the
  // conditions a waker sets.
  const uint64_t helperEvents = helperEvents_.load(std::memory_order_acquire);
  const bool helperFinished = helperEvents != helperEventsSeen_;
  helperEventsSeen_ = helperEvents;  // a later wait blocks unless another job ends
  if (arrivalsPending()) connectionsReady_ = true;  // the mailbox has no descriptor to wake the poll
  if (helperFinished || progress() || abortRequested_.load() || (interrupt && interrupt())) return Blocked::Moved;
  // Sleep no later than the deadline and the next slow check (lifelines, the
  // abort notice, dead peers). While a reported peer death is in its grace
  // period, look again soon.
  const auto now = Clock::now();
  auto until = std::min(deadline_, std::max(lastSlowCheck_ + kSlowCheckEvery, now));
  if (peerFailed_.load()) until = std::min(until, now + std::chrono::milliseconds(10));
  for (auto& t : transports_)
    if (t->hasSilentPeers()) until = std::min(until, now + std::chrono::milliseconds(1));
  const timespec ts = toTimespec(until - now);
  Counters::add(counters_.blockedWaits, 1);
  int rc = ppoll(waitFds_.data(), waitFds_.size(), &ts, nullptr);
  const int err = errno;
  announced.withdraw();
  if (rc < 0 && err != EINTR) return Blocked::Cannot;  // cannot block here: poll instead
  connectionsReady_ = true;  // a peer may have dialed: look at the sockets at once
  return Blocked::Slept;
}

void Communicator::announceIdle(bool transports) {
  // Under the engine's lock: an inline operation may change connections_
  // while waitIdle() blocks. A descriptor it closes meanwhile only makes the
  // poll return early.
  idleFds_.clear();
  idleFds_.push_back(pollfd{wakeup_.fd(), POLLIN, 0});
  if (connections_) connections_->addPollFds(idleFds_);
  idleShort_ = false;
  // Announced before the transports prepare, as blockUntilActivity does: a
  // waker acting while they arm must find the announcement.
  wakeup_.announce();
  if (transports) {
    for (auto& t : transports_) {
      if (!t->prepareWait(idleFds_, !anySource_.empty())) {
        idleShort_ = true;
        break;
      }
      ++idlePrepared_;
      idleShort_ = idleShort_ || t->hasSilentPeers();
    }
  }
}

void Communicator::endIdleWait() {
  for (size_t i = 0; i < idlePrepared_; ++i) transports_[i]->afterWait();
  idlePrepared_ = 0;
}

void Communicator::waitIdle(bool sleep) {
  // Bounded, so a lost wake-up costs a second, not a hang. A connection
  // delivered before announceIdle() raises no wake-up: look first.
  if (sleep && !arrivalsPending()) {
    const timespec ts = toTimespec(idleShort_ ? std::chrono::milliseconds(1) : std::chrono::milliseconds(1000));
    ppoll(idleFds_.data(), idleFds_.size(), &ts, nullptr);
  }
  wakeup_.withdraw();
}

void Communicator::serveConnections() {
  if (connections_) connections_->progress(/*now=*/true);
}

void Communicator::waitAll(Request* const* reqs, size_t n) {
  auto failedOrDone = [&] {
    bool all = true;
    for (size_t i = 0; i < n; ++i) {
      if (!reqs[i]->done) all = false;
      else if (reqs[i]->failed()) throwFailure(reqs[i]->error, reqs[i]->peerEnded);
    }
    return all;
  };
  waitUntil(failedOrDone, [&] {
    for (size_t i = 0; i < n; ++i)
      if (!reqs[i]->done) {
        const int peer = reqs[i]->peer;
        std::string connection;
        if (peer >= 0 && connections_ && route(peer)->needsConnection(peer))
          connection = str(" (", connections_->status(peer), ")");
        return str("rank ", peer < 0 ? std::string("<any>") : std::to_string(peer),
                   reqs[i]->kind == Request::Kind::Send ? " to receive " : " to send ", reqs[i]->len, " bytes",
                   connection);
      }
    return std::string("peers");
  });
}

}  // namespace roce::comm
