#include "communicator.hpp"

#include <unistd.h>

#include <cstdlib>

#include "../common/error.hpp"
#include "../common/log.hpp"
#include "../transport/shm/node_shm.hpp"
#include "../transport/shm/shm_transport.hpp"
#include "../transport/tcp/tcp_transport.hpp"
#include "../transport/verbs/device_probe.hpp"
#include "../transport/verbs/verbs_transport.hpp"

namespace roce {
namespace {
constexpr auto kSlowCheckEvery = std::chrono::milliseconds(200);
const char* kAbortKey = "roce_abort";
}  // namespace

Communicator::Communicator(std::unique_ptr<Bootstrap> bs, const Config& cfg, int rank, int size,
                           int globalRank, std::chrono::milliseconds timeout)
    : cfg_(cfg), bs_(std::move(bs)), timeout_(timeout) {
  RankInfo me;
  me.hostId = localHostId();
  me.nodeId = cfg_.simRanksPerNode > 0 ? str("sim-node-", globalRank / cfg_.simRanksPerNode, "@", me.hostId)
                                       : me.hostId;
  me.pid = getpid();
  std::shared_ptr<VerbsDevice> verbsDev;
  if (size > 1) {
    listener_ = std::make_unique<TcpListener>();
    me.tcpHost = tcpAdvertiseAddress(cfg_);
    me.tcpPort = listener_->port();
    if (cfg_.netTransport != "tcp") {
      // Open the RDMA port now, so every rank can tell the others whether it has one.
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
  bs_->set(str("info/", rank), me.encode());
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(str("info/", r));
  auto values = waitForKeys(*bs_, keys, timeout_, str("roce process group init on rank ", rank),
                            [](size_t r) { return str("rank ", r, " (it has not joined the group)"); });
  std::vector<RankInfo> infos;
  for (auto& v : values) infos.push_back(RankInfo::decode(v));
  topo_ = Topology::build(rank, infos);

  routes_.assign(size, nullptr);
  const bool useShm = !cfg_.forceNetwork && topo_.localRanks.size() > 1;
  if (useShm) {
    nodeShm_ = std::make_unique<NodeShm>(*bs_, topo_.localRanks, topo_.localIndex, cfg_.shmRingBytes,
                                         cfg_.shmSlotBytes, timeout_);
    transports_.push_back(std::make_unique<ShmTransport>(rank, size, *nodeShm_, topo_.localRanks));
    for (int r : topo_.localRanks)
      if (r != rank) routes_[r] = transports_.back().get();
  }
  // Peers not served by shared memory go over the network.
  std::vector<bool> viaNet(size, false);
  std::vector<TcpEndpoint> eps(size);
  bool anyNet = false;
  for (int r = 0; r < size; ++r) {
    if (r == rank || routes_[r]) continue;
    viaNet[r] = anyNet = true;
    eps[r] = {infos[r].hostId == me.hostId ? "127.0.0.1" : infos[r].tcpHost, infos[r].tcpPort};
  }
  const std::string net = chooseNetworkTransport(infos);
  if (anyNet && net == "verbs") {
    transports_.push_back(std::make_unique<VerbsTransport>(rank, verbsDev, cfg_, *bs_, viaNet, timeout_));
  } else if (anyNet) {
    transports_.push_back(std::make_unique<TcpTransport>(rank, *listener_, eps, viaNet, timeout_));
  }
  for (int r = 0; r < size; ++r)
    if (viaNet[r]) routes_[r] = transports_.back().get();
  listener_.reset();  // all connections are made

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

Communicator::~Communicator() = default;

std::string Communicator::chooseNetworkTransport(const std::vector<RankInfo>& infos) const {
  if (cfg_.netTransport == "tcp") return "tcp";
  // Which ranks talk over the network at all (the same answer on every rank).
  std::string lacking;
  bool anyNetwork = false;
  for (int r = 0; r < topo_.size; ++r) {
    bool needsNet = cfg_.forceNetwork ? topo_.size > 1 : topo_.numNodes > 1;
    if (!needsNet) continue;
    anyNetwork = true;
    if (!infos[r].verbs) lacking += str("\n  rank ", r, ": ", infos[r].noVerbsWhy);
  }
  if (!anyNetwork || lacking.empty()) return "verbs";
  throwInvalid(str("this group spans ", cfg_.forceNetwork ? "the network (ROCE_PG_FORCE_NETWORK=1)" : "several machines",
                   " but not every rank has a usable RDMA port:", lacking,
                   "\nFix the RDMA setup (ibv_devinfo should show an ACTIVE port), or set ROCE_PG_NET_TRANSPORT=tcp "
                   "on every rank to use TCP between machines"));
}

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
  opName_ = what;
  deadline_ = deadline;
  if (!broken_.empty())
    throwComm(str(what, " refused: this process group failed earlier and cannot be used any more (",
                  broken_, "). Destroy it and create a new one"));
}

void Communicator::post(Request& r) {
  r.done = false;
  r.error.clear();
  if (!broken_.empty()) return r.fail(broken_);
  Transport* t = route(r.peer);
  if (r.kind == Request::Kind::Send) t->postSend(&r);
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

void Communicator::throwFailure(const std::string& msg) { throwComm(str(opName_, " on rank ", rank(), " failed: ", msg)); }

void Communicator::checkDeadline(const std::function<std::string()>& waitingFor) {
  if (abortRequested_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> g(abortMu_);
    throw Error(ErrorKind::Aborted, str("roce: ", opName_, " on rank ", rank(), " was aborted: ", abortReason_));
  }
  if (Clock::now() >= deadline_) {
    auto total = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count();
    throwTimeout(str(opName_, " on rank ", rank(), " timed out (group timeout ", total, " ms) waiting for ",
                     waitingFor(), ". That rank may have crashed, hung, or called a different "
                     "collective (every rank must issue the same collectives in the same order)"));
  }
}

void Communicator::slowChecks() {
  for (auto& t : transports_)
    if (std::string dead = t->checkPeers(); !dead.empty()) throwFailure(dead);
  if (auto msg = bs_->tryGet(kAbortKey))
    throwComm(str(opName_, " on rank ", rank(), " stopped because another rank failed: ", *msg));
}

void Communicator::waitUntil(const std::function<bool()>& done, const std::function<std::string()>& waitingFor) {
  Backoff backoff;
  uint64_t spins = 0;
  while (!done()) {
    if (progress()) backoff.reset();
    else backoff.pause();
    checkDeadline(waitingFor);
    if ((++spins & 63) == 0 && idleHook) idleHook();
    if (backoff.sleeping() && Clock::now() - lastSlowCheck_ > kSlowCheckEvery) {
      lastSlowCheck_ = Clock::now();
      slowChecks();
    }
  }
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
      if (!reqs[i]->done)
        return str("rank ", reqs[i]->peer < 0 ? std::string("<any>") : std::to_string(reqs[i]->peer),
                   reqs[i]->kind == Request::Kind::Send ? " to receive " : " to send ", reqs[i]->len, " bytes");
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
  try {
    if (!bs_->tryGet(kAbortKey)) bs_->set(kAbortKey, str("rank ", rank(), ": ", reason));
  } catch (...) {
    // The store may be gone already (shutdown); peers then find out by timeout.
  }
}

void Communicator::requestAbort(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(abortMu_);
    abortReason_ = why;
  }
  abortRequested_.store(true);
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
    scratch_[index].reset(static_cast<char*>(p));
    scratchBytes_[index] = n;
  }
  return scratch_[index].get();
}

}  // namespace roce
