#include "communicator.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <random>

#include "../common/error.hpp"
#include "../common/log.hpp"
#include "../common/spin.hpp"
#include "lifeline.hpp"
#include "../transport/shm/node_shm.hpp"
#include "../transport/shm/shm_transport.hpp"
#include "../transport/tcp/tcp_connect.hpp"
#include "../transport/tcp/tcp_transport.hpp"
#include "../transport/verbs/device_probe.hpp"
#include "../transport/verbs/verbs_transport.hpp"
#include "connection_manager.hpp"
#include "roster.hpp"

namespace roce {
namespace {
constexpr auto kSlowCheckEvery = std::chrono::milliseconds(200);
// A peer's death is acted on this long after it was noticed, so that data it
// sent just before exiting (still in flight on another socket) is consumed
// first and a wait that can complete does.
constexpr auto kPeerFailureGrace = std::chrono::milliseconds(300);
}  // namespace

namespace {

uint64_t randomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

Communicator::Communicator(Bootstrap& store, const Config& cfg, int rank, int size, int globalRank,
                           std::chrono::milliseconds timeout)
    : cfg_(cfg), timeout_(timeout) {
  const auto deadline = Clock::now() + timeout_;
  const Incarnation inc = joinIncarnation(store, rank);
  ScopedBootstrap bs(store, inc.prefix());
  RankInfo me;
  me.hostId = localHostId();
  me.nodeId = !cfg_.simNode.empty()       ? str("sim-node-", cfg_.simNode, "@", me.hostId)
              : cfg_.simRanksPerNode > 0 ? str("sim-node-", globalRank / cfg_.simRanksPerNode, "@", me.hostId)
                                         : me.hostId;
  me.pid = getpid();
  me.nonce = randomNonce();
  me.shmRingBytes = cfg_.shmRingBytes;
  me.shmSlotBytes = cfg_.shmSlotBytes;
  me.algorithms = cfg_.algorithmSettings();
  me.cpus = Config::usableCpus();
  std::shared_ptr<VerbsDevice> verbsDev;
  if (size > 1) {
    listener_ = std::make_unique<TcpListener>();
    me.tcpHost = tcpAdvertiseAddress(cfg_);
    me.tcpPort = listener_->port();
    if (cfg_.netTransport != "tcp") {
      // Open the RDMA port now, so the leader can tell whether every rank has one.
      if (auto choice = chooseVerbsPort(cfg_, me.noVerbsWhy)) {
        try {
          verbsDev = std::make_shared<VerbsDevice>(*choice, cfg_);
        } catch (const Error& e) {
          me.noVerbsWhy = e.what();
        }
      }
      me.verbs = verbsDev != nullptr;
    } else {
      me.noVerbsWhy = "ROCE_PG_NET_TRANSPORT=tcp";
    }
  }
  const Roster roster = exchangeRoster(bs, store, inc, rank, size, me, cfg_, deadline, timeout_);
  const std::vector<RankInfo>& infos = roster.ranks;
  topo_ = Topology::build(rank, infos);
  for (const auto& info : infos) hostNames_.push_back(info.hostName());
  cfg_.nChannels = roster.channels;
  cfg_.forceNetwork = roster.forceNetwork;
  // While waiting for a peer during setup: has it been replaced by a newer process?
  auto probe = [&](int peer) {
    return [&store, &inc, peer] {
      if (std::string moved = replacedRanks(store, inc, {peer}); !moved.empty())
        throwComm(str("this group cannot form: ", moved, ". That process was restarted or re-created the group "
                      "after this formation began; call init_process_group/new_group again on every rank"));
    };
  };

  endpoints_.resize(size);
  std::vector<uint64_t> nonces;
  for (int r = 0; r < size; ++r) {
    endpoints_[r] = {infos[r].hostId == me.hostId ? "127.0.0.1" : infos[r].tcpHost, infos[r].tcpPort};
    nonces.push_back(infos[r].nonce);
  }
  std::unique_ptr<TcpAcceptor> acceptor;
  if (size > 1) {
    acceptor = std::make_unique<TcpAcceptor>(*listener_, rank, nonces);
    connectLifelines(*acceptor, endpoints_, me.nonce, deadline, probe);
  }

  routes_.assign(size, nullptr);
  const bool useShm = !cfg_.forceNetwork && topo_.localRanks.size() > 1;
  if (useShm) {
    nodeShm_ = std::make_unique<NodeShm>(bs, topo_.localRanks, topo_.localIndex, cfg_.shmRingBytes,
                                         cfg_.shmSlotBytes, deadline, timeout_);
    transports_.push_back(std::make_unique<ShmTransport>(rank, size, *nodeShm_, topo_.localRanks));
    for (int r : topo_.localRanks)
      if (r != rank) routes_[r] = transports_.back().get();
  }
  // Peers not served by shared memory go over the network.
  std::vector<bool> viaNet(size, false);
  bool anyNet = false;
  for (int r = 0; r < size; ++r) {
    if (r == rank || routes_[r]) continue;
    viaNet[r] = anyNet = true;
  }
  const std::string& net = roster.network;
  if (anyNet && net == "verbs") {
    transports_.push_back(std::make_unique<VerbsTransport>(rank, verbsDev, cfg_, bs, viaNet, deadline, timeout_));
  } else if (anyNet) {
    transports_.push_back(std::make_unique<TcpTransport>(rank, size, hostNames_));
  }
  for (int r = 0; r < size; ++r)
    if (viaNet[r]) routes_[r] = transports_.back().get();
  viaShm_.assign(size, false);
  for (int r = 0; r < size; ++r) viaShm_[r] = routes_[r] && !viaNet[r];
  for (auto& t : transports_) t->setCounters(&counters_);
  if (anyNet && net == "tcp") {
    // The listener stays open for the group's life: peers connect when they
    // first need this rank.
    connections_ = std::make_unique<ConnectionManager>(
        rank, net, endpoints_, hostNames_, me.nonce, std::move(listener_), std::move(acceptor),
        [this](int peer, UniqueFd fd) { route(peer)->adoptConnection(peer, fd.release()); },
        [this](int peer, const std::string& why) { route(peer)->failPeer(peer, why); }, counters_);
    if (cfg_.connect == "eager") connectAll(viaNet, deadline);
  }
  acceptor.reset();
  listener_.reset();

  if (logLevel() >= LogLevel::Info && rank == 0) {
    std::string rdma;
    for (const auto& p : probeRdmaPorts())
      rdma += str(rdma.empty() ? "" : ", ", p.device, ":", p.port, " ", p.state, " ", p.linkLayer, " mtu ", p.activeMtu);
    ROCE_INFO("group of ", size, " ranks on ", topo_.numNodes, " node(s); rank 0 has ",
              topo_.localRanks.size(), " local rank(s); shared memory ", useShm ? "on" : "off",
              "; network transport ", anyNet ? net : "none",
              net == "verbs" && verbsDev ? str(" (", verbsDev->describe(), ")") : "", "; RDMA ports seen: ",
              rdma.empty() ? "none" : rdma, "; ", cfg_.describe());
  }
}

void Communicator::connectLifelines(TcpAcceptor& acceptor, const std::vector<TcpEndpoint>& eps, uint64_t nonce,
                                    Clock::time_point deadline,
                                    const std::function<std::function<void()>(int)>& probe) {
  // The ring neighbours (one of them for two ranks); the lower rank of a pair dials.
  const auto& order = topo_.ringOrder;
  const int n = topo_.size;
  const int pos = topo_.ringIndexOf[rank()];
  std::vector<int> neighbours{order[(pos + 1) % n]};
  if (n > 2) neighbours.push_back(order[(pos + n - 1) % n]);
  std::vector<Lifeline::Link> links;
  try {
    for (int peer : neighbours)
      if (peer > rank())
        links.push_back({peer, hostNames_[peer], dialRank(eps[peer], LinkKind::Lifeline, rank(), peer, nonce, deadline, probe(peer)).release()});
    for (int peer : neighbours)
      if (peer < rank())
        links.push_back({peer, hostNames_[peer], acceptor.take(LinkKind::Lifeline, peer, deadline, "lifeline setup", probe(peer)).release()});
  } catch (...) {
    for (auto& l : links) close(l.fd);
    throw;
  }
  for (auto& l : links) tuneSocket(l.fd);
  lifeline_ = std::make_unique<Lifeline>(rank(), hostNames_[rank()], std::move(links), cfg_.heartbeatTimeoutMs,
                                         [this](const std::string& why) { onPeerFailure(why); });
}

void Communicator::connectAll(const std::vector<bool>& viaNet, Clock::time_point deadline) {
  // ROCE_PG_CONNECT=eager: the full mesh at init. The lower rank of each pair
  // dials (no ties to resolve); everyone waits until all its peers are in.
  std::vector<int> peers;
  for (int r = 0; r < size(); ++r)
    if (viaNet[r]) peers.push_back(r);
  for (int r : peers)
    if (r > rank()) connections_->want(r);
  std::vector<pollfd> fds;
  for (;;) {
    connections_->progress(/*now=*/true);
    auto missing = std::find_if(peers.begin(), peers.end(), [&](int r) { return route(r)->needsConnection(r); });
    if (missing == peers.end()) return;
    if (Clock::now() >= deadline)
      throwTimeout(str("connecting rank ", rank(), " to every peer (ROCE_PG_CONNECT=eager) timed out after ",
                       timeout_.count(), " ms: ", connections_->status(*missing)));
    if (peerFailed_.load()) throwIfPeerFailed("connecting every peer (ROCE_PG_CONNECT=eager)");
    fds.clear();
    connections_->addPollFds(fds);
    poll(fds.data(), fds.size(), 100);
  }
}

void Communicator::onPeerFailure(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(abortMu_);
    if (peerFailed_.load()) return;
    peerFailure_ = why;
    peerFailedAt_ = Clock::now();
  }
  peerFailed_.store(true);
  wakeup_.wake();
}

void Communicator::leaveGracefully() {
  if (lifeline_) lifeline_->leave();
}

Communicator::~Communicator() = default;

void Communicator::FreeDeleter::operator()(void* p) const { std::free(p); }

const char* Communicator::transportName(int peer) const {
  return routes_.at(peer) ? routes_[peer]->name() : "self";
}

Transport* Communicator::route(int peer) const {
  if (peer < 0 || peer >= size() || !routes_[peer])
    throwInvalid(str("rank ", rank(), ": no transport to rank ", peer, " (group size ", size(), ")"));
  return routes_[peer];
}

void Communicator::beginOperation(const std::string& what, Clock::time_point deadline) {
  opWhat_ = nullptr;
  opName_ = what;
  deadline_ = deadline;
  startOperation();
}

void Communicator::beginOperation(const Describable& what, Clock::time_point deadline) {
  opWhat_ = &what;
  deadline_ = deadline;
  startOperation();
}

void Communicator::endOperation() {
  if (opWhat_) opName_ = "operation";
  opWhat_ = nullptr;
  // Between operations the engine's idle waits (async point-to-point work,
  // with deadlines of their own) must not sleep against a finished one's.
  deadline_ = Clock::time_point::max();
}

void Communicator::startOperation() {
  Counters::add(counters_.ops, 1);
  // The previous collective's requests can go once no transport can touch them.
  if (!hasPendingRequests()) owned_.clear();
  if (broken_.empty() && peerFailed_.load()) {
    std::lock_guard<std::mutex> g(abortMu_);
    broken_ = peerFailure_;
  }
  if (!broken_.empty())
    throwComm(str(opName(), " refused: this process group failed earlier and cannot be used any more (",
                  broken_, "). Destroy it and create a new one"));
}

bool Communicator::hasPendingRequests() const {
  for (const Request& r : owned_)
    if (!r.done) return true;
  return false;
}

Request* Communicator::post(Request::Kind kind, int peer, uint64_t tag, void* buf, size_t len, uint8_t lane) {
  Request& r = owned_.emplace_back();
  r.kind = kind;
  r.lane = lane;
  r.peer = peer;
  r.tag = tag;
  r.buf = buf;
  r.len = len;
  attachOwner(r);
  post(r);
  return &r;
}

void Communicator::attachOwner(Request& r) const {
  // Below the zero-copy threshold no transport registers the buffer.
  if (cfg_.ibZeroCopyMinBytes == 0 || r.len < cfg_.ibZeroCopyMinBytes) return;
  for (const BufferOwner& o : taskOwners_)
    if (o.covers(r.buf, r.len)) { r.owner = o; return; }
  for (size_t i = 0; i < scratch_.size(); ++i) {
    BufferOwner o{std::static_pointer_cast<void>(scratch_[i]), scratch_[i].get(), scratch_[i].get(), scratchBytes_[i]};
    if (o.covers(r.buf, r.len)) { r.owner = std::move(o); return; }
  }
}

void Communicator::post(Request& r) {
  r.done = false;
  r.error.clear();
  if (!broken_.empty()) return r.fail(broken_);
  Transport* t = route(r.peer);
  if (connections_ && t->needsConnection(r.peer)) connections_->want(r.peer);
  if (r.kind == Request::Kind::Send) {
    Counters::add(viaShm_[r.peer] ? counters_.bytesSentShm : counters_.bytesSentNet, r.len);
    Counters::add(counters_.sends, 1);
    t->postSend(&r);
  }
  else t->postRecv(&r);
}

void Communicator::postRecvAnySource(Request& r) {
  r.done = false;
  r.error.clear();
  r.peer = -1;
  if (!broken_.empty()) return r.fail(broken_);
  anySource_.push_back(&r);
  progress();
}

bool Communicator::progress() {
  bool moved = false;
  if (connections_) {
    moved |= connections_->progress(connectionsReady_);
    connectionsReady_ = false;
  }
  for (auto& t : transports_) moved |= t->progress();
  for (size_t i = 0; i < anySource_.size();) {
    Request* r = anySource_[i];
    int chosen = -1;
    for (int p = 0; p < size() && chosen < 0; ++p)
      if (routes_[p] && routes_[p]->hasUnmatched(p, r->tag)) chosen = p;
    if (chosen < 0) { ++i; continue; }
    r->peer = chosen;
    routes_[chosen]->postRecv(r);
    anySource_.erase(anySource_.begin() + static_cast<long>(i));
    moved = true;
  }
  return moved;
}

void Communicator::throwFailure(const std::string& msg) {
  // A connection that broke is often the echo of an earlier failure (the rank
  // that saw it first tore its group down): name that root cause too.
  std::string cause;
  if (peerFailed_.load()) {
    std::lock_guard<std::mutex> g(abortMu_);
    cause = peerFailure_;
  }
  if (!cause.empty() && msg.find(cause) == std::string::npos)
    throwComm(str(opName(), " on rank ", rank(), " failed: ", msg, " (first failure reported in the group: ", cause, ")"));
  throwComm(str(opName(), " on rank ", rank(), " failed: ", msg));
}

void Communicator::checkDeadline(const std::function<std::string()>& waitingFor) {
  if (abortRequested_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> g(abortMu_);
    throw Error(ErrorKind::Aborted, str("roce: ", opName(), " on rank ", rank(), " was aborted: ", abortReason_));
  }
  if (peerFailed_.load(std::memory_order_relaxed)) throwIfPeerFailed(opName());  // names only when needed
  if (Clock::now() >= deadline_) {
    auto total = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count();
    throwTimeout(str(opName(), " on rank ", rank(), " timed out (group timeout ", total, " ms) waiting for ",
                     waitingFor(), ". That rank may have crashed, hung, or called a different "
                     "collective (every rank must issue the same collectives in the same order)"));
  }
}

void Communicator::throwIfPeerFailed(const std::string& what) {
  if (!peerFailed_.load(std::memory_order_relaxed)) return;
  std::string why;
  {
    std::lock_guard<std::mutex> g(abortMu_);
    if (Clock::now() - peerFailedAt_ >= kPeerFailureGrace) why = peerFailure_;
  }
  if (!why.empty()) throwComm(str(what, " on rank ", rank(), " stopped: ", why));
}

void Communicator::checkHealth() {
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
  // died is reported by the lifelines (csrc/comm/lifeline.hpp) to everyone.
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
  // Pending shared-memory traffic, which no descriptor announces: the spin
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
  for (auto& t : transports_)
    if (!t->prepareWait(waitFds_, !anySource_.empty())) return Blocked::Cannot;
  if (connections_) connections_->addPollFds(waitFds_);
  wakeup_.announce();
  // What arrived before the transports armed their notifications raises no
  // event: look once more. Then the conditions a waker sets.
  const uint64_t helperEvents = helperEvents_.load(std::memory_order_acquire);
  const bool helperFinished = helperEvents != helperEventsSeen_;
  helperEventsSeen_ = helperEvents;  // a later wait blocks unless another job ends
  if (helperFinished || progress() || abortRequested_.load() || (interrupt && interrupt())) {
    wakeup_.withdraw();
    return Blocked::Moved;
  }
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
  wakeup_.withdraw();
  if (rc < 0 && errno != EINTR) return Blocked::Cannot;  // cannot block here: poll instead
  for (auto& t : transports_) t->afterWait();
  connectionsReady_ = true;  // a peer may have dialed: look at the sockets at once
  return Blocked::Slept;
}

void Communicator::announceIdle() {
  // Under the engine's lock: an inline operation may change connections_
  // while waitIdle() blocks. A descriptor it closes meanwhile only makes the
  // poll return early.
  idleFds_.clear();
  idleFds_.push_back(pollfd{idleWakeup_.fd(), POLLIN, 0});
  if (connections_) connections_->addPollFds(idleFds_);
  idleWakeup_.announce();
}

void Communicator::waitIdle() {
  // Bounded, so a lost wake-up costs a second, not a hang.
  const timespec ts = toTimespec(std::chrono::seconds(1));
  ppoll(idleFds_.data(), idleFds_.size(), &ts, nullptr);
  idleWakeup_.withdraw();
}

void Communicator::serveConnections() {
  if (connections_) connections_->progress(/*now=*/true);
}

void Communicator::waitAll(Request* const* reqs, size_t n) {
  auto failedOrDone = [&] {
    bool all = true;
    for (size_t i = 0; i < n; ++i) {
      if (!reqs[i]->done) all = false;
      else if (reqs[i]->failed()) throwFailure(reqs[i]->error);
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

void Communicator::transportsFailAll(const std::string& why) {
  for (auto& t : transports_) t->failAll(why);
  for (Request* r : anySource_) r->fail(why);
  anySource_.clear();
}

void Communicator::breakWith(const std::string& reason, bool tellPeers) {
  if (!broken_.empty()) return;
  broken_ = reason;
  transportsFailAll(reason);
  if (!tellPeers) return;
  // The lifelines carry the notice around the ring in both directions; the
  // store is not used after init (its host may be the one that failed).
  if (lifeline_) lifeline_->announceFailure(str("rank ", rank(), " (host ", hostNames_[rank()], ") failed: ", reason));
}

void Communicator::requestAbort(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(abortMu_);
    abortReason_ = why;
  }
  abortRequested_.store(true);
  wakeup_.wake();
}

HelperThread& Communicator::helper(int index) {
  if (helpers_.size() <= static_cast<size_t>(index)) helpers_.resize(index + 1);
  if (!helpers_[index])
    helpers_[index] = std::make_unique<HelperThread>(cfg_.spinUs, [this] {
      helperEvents_.fetch_add(1, std::memory_order_seq_cst);
      wakeup_.wake();
    });
  return *helpers_[index];
}

void* Communicator::scratch(size_t bytes, int index) {
  if (scratch_.size() <= static_cast<size_t>(index)) {
    scratch_.resize(index + 1);
    scratchBytes_.resize(index + 1, 0);
  }
  if (scratchBytes_[index] < bytes) {
    size_t n = (bytes + 4095) & ~size_t(4095);
    void* p = std::aligned_alloc(64, n);
    if (!p) throwComm(str("out of memory allocating ", n, " bytes of scratch"));
    scratch_[index] = std::shared_ptr<char>(static_cast<char*>(p), FreeDeleter{});
    scratchBytes_[index] = n;
  }
  return scratch_[index].get();
}

}  // namespace roce
