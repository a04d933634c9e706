// How a Communicator forms: joining the group's leader (join.hpp), the roster, lifelines to the ring
// neighbours, shared memory with the ranks of this machine, the network
// transport (its connections made on demand, or all at once with
// ROCE_PG_CONNECT=eager). See docs/ARCHITECTURE.md, "How a group forms".
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <random>

#include "../common/error.hpp"
#include "../common/log.hpp"
#include "../common/worker_pool.hpp"
#include "../transport/shm/node_shm.hpp"
#include "../transport/shm/shm_transport.hpp"
#include "../runtime/connect.hpp"
#include "../runtime/front_desk.hpp"
#include "../runtime/process_runtime.hpp"
#include "../transport/tcp/tcp_transport.hpp"
#include "../transport/verbs/device_probe.hpp"
#include "../transport/verbs/verbs_transport.hpp"
#include "../comm/communicator.hpp"
#include "../comm/connection_manager.hpp"
#include "../liveness/lifeline.hpp"
#include "../runtime/process_links.hpp"
#include "join.hpp"
#include "../membership/roster.hpp"

namespace roce {

namespace {

// One descriptor per connected peer: an alltoall at 1,024 ranks needs more
// than the common default soft limit (1,024). Raising the soft limit to the
// hard one is what the limit pair is for; done once per process.
void raiseDescriptorLimit() {
  static std::once_flag once;
  std::call_once(once, [] {
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  });
}

uint64_t randomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

namespace {
// Counts the store operations of a group's formation (tests: a subgroup
// formed from its parent makes none of its own beyond shared memory).
class CountingBootstrap : public Bootstrap {
 public:
  CountingBootstrap(Bootstrap& inner, int& count) : inner_(inner), count_(count) {}
  void set(const std::string& k, const std::string& v) override { ++count_, inner_.set(k, v); }
  int64_t add(const std::string& k, int64_t d) override { return ++count_, inner_.add(k, d); }
  bool wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override { return ++count_, inner_.wait(k, t); }
  std::vector<std::string> multiGet(const std::vector<std::string>& k) override { return ++count_, inner_.multiGet(k); }
  bool check(const std::string& k) override { return ++count_, inner_.check(k); }

 private:
  Bootstrap& inner_;
  int& count_;
};

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

Communicator::Communicator(Bootstrap& outerStore, const Config& cfg, int rank, int size, int globalRank,
                           std::chrono::milliseconds timeout)
    : cfg_(cfg), timeout_(timeout) {
  const auto deadline = Clock::now() + timeout_;
  CountingBootstrap store(outerStore, formationStoreOps_);
  raiseDescriptorLimit();
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
  if (size > 1) {
    // The process's one listener; connections naming this rank's nonce come
    // to this group's mailbox (runtime/front_desk.hpp).
    FrontDesk& desk = ProcessRuntime::get().desk();
    mailbox_ = std::make_unique<MailboxLease>(desk, me.nonce);
    me.tcpHost = tcpAdvertiseAddress(cfg_);
    me.tcpPort = desk.port();
    if (cfg_.netTransport != "tcp") {
      // Open the RDMA ports now, so the leader can tell whether every rank has one.
      // A port that cannot be opened is left out (said at INFO); none at all is what noVerbsWhy tells.
      std::string failed;
      for (const auto& choice : chooseVerbsPorts(cfg_, globalRank, me.noVerbsWhy)) {
        try {
          verbsRails_.push_back(VerbsDevice::shared(choice, cfg_));  // one per port per process
        } catch (const Error& e) {
          failed += str(failed.empty() ? "" : "; ", e.what());
        }
      }
      if (!failed.empty() && verbsRails_.empty()) me.noVerbsWhy = failed;
      else if (!failed.empty()) ROCE_INFO("rank ", globalRank, ": RDMA ports left out: ", failed);
      me.verbsRails = static_cast<int>(verbsRails_.size());
    } else {
      me.noVerbsWhy = "ROCE_PG_NET_TRANSPORT=tcp";
    }
  }
  // A group of one needs nobody and touches no store key.
  Joined joined = size > 1 ? joinGroup(store, *mailbox_->box(), rank, size, me, cfg_, deadline, timeout_)
                           : Joined{planGroup(cfg_, {me}), ""};
  form(store, std::move(joined.roster), joined.incarnation, rank, deadline);
}

Communicator::Communicator(const Communicator& parent, Bootstrap& outerStore, const Config& cfg, int rank,
                           const std::vector<int>& parentRanks, const std::string& groupName,
                           std::chrono::milliseconds timeout)
    : cfg_(cfg), timeout_(timeout) {
  const auto deadline = Clock::now() + timeout_;
  CountingBootstrap store(outerStore, formationStoreOps_);
  fromParent_ = true;
  // As set, before form() resolves auto values (the neighbours compare these).
  settingsToCompare_ = cfg_.algorithmSettings();
  Roster roster = deriveRoster(cfg_, parent.roster_, parentRanks, groupName);
  if (rank < 0 || rank >= static_cast<int>(roster.ranks.size()) || parentRanks[rank] != parent.rank())
    throwInvalid(str("subgroup rank ", rank, " is not this process's parent rank ", parent.rank()));
  verbsRails_ = parent.verbsRails_;
  if (roster.ranks.size() > 1)
    mailbox_ = std::make_unique<MailboxLease>(ProcessRuntime::get().desk(), roster.ranks[rank].nonce);
  const std::string incarnation = hex64(roster.ranks[0].nonce);
  form(store, std::move(roster), incarnation, rank, deadline);
}

void Communicator::form(Bootstrap& store, Roster formed, const std::string& incarnation, int myRank,
                        Clock::time_point deadline) {
  roster_ = std::move(formed);
  const Roster& roster = roster_;
  ScopedBootstrap bs(store, str("roce/", incarnation, "/"));  // this incarnation's keys
  const std::vector<RankInfo>& infos = roster.ranks;
  topo_ = Topology::build(myRank, infos);
  const int rank = myRank, size = static_cast<int>(infos.size());
  const RankInfo& me = infos[rank];
  for (const auto& info : infos) hostNames_.push_back(info.hostName());
  cfg_.nChannels = roster.channels;
  // This rank's share of the machine's CPUs (the real machine: simulated
  // nodes split one host but not its cores). Peers never depend on it.
  const int onHost = static_cast<int>(
      std::count_if(infos.begin(), infos.end(), [&](const RankInfo& i) { return i.hostId == me.hostId; }));
  const int cpus = me.cpus;
  // Auto is resolved once per process, by its first group (normally the
  // world): a later subgroup with fewer ranks here still shares the machine
  // with the others, and must not grow the pool past their share.
  static const int autoWorkers = Config::workersAuto(cpus, onHost);
  if (cfg_.workers == 0) cfg_.workers = autoWorkers;
  // The pool's threads are created here, on the thread creating the group,
  // so they inherit its CPU affinity (docs/ARCHITECTURE.md, "Worker
  // threads"). Spinning between jobs only pays when every thread has a core
  // of its own; with more threads than CPUs a spinning worker takes the core
  // a peer rank needs (measured: +20% CPU per GB with 2 ranks x 2 workers on
  // 2 cores, docs/PERFORMANCE.md).
  const bool ownCores = cfg_.workers * onHost <= cpus;
  if (cfg_.workers > 1 && size > 1) WorkerPool::process().ensureThreads(cfg_.workers - 1, ownCores ? cfg_.spinUs : 0);
  cfg_.forceNetwork = roster.forceNetwork;
  endpoints_.resize(size);
  for (int r = 0; r < size; ++r) {
    endpoints_[r] = {infos[r].hostId == me.hostId ? "127.0.0.1" : infos[r].tcpHost, infos[r].tcpPort};
    nonces_.push_back(infos[r].nonce);
  }
  std::unique_ptr<TcpAcceptor> acceptor;
  if (size > 1) {
    acceptor = std::make_unique<TcpAcceptor>(mailbox_->box(), rank, nonces_);
    // While waiting for a neighbour's lifeline: every rank's listener was open
    // before it joined, so one that refuses connections means that rank is
    // gone (it exited after joining), and waiting longer cannot help.
    // Its process lives on after a failed or destroyed group (the listener is
    // the process's), so ask its front desk whether the group is still there.
    auto probe = [this](int peer) {
      return [this, peer] {
        const PeerState s = probePeer(endpoints_[peer], this->rank(), peer, nonces_[this->rank()], nonces_[peer]);
        if (s == PeerState::ProcessGone)
          throwComm(str("rank ", peer, " (host ", hostNames_[peer], ", ", endpoints_[peer].host, ":",
                        endpoints_[peer].port, ") is gone: its listener refuses connections. It exited after "
                        "joining the group; see that rank's log"));
        if (s == PeerState::GroupGone)
          throwComm(str("rank ", peer, " (host ", hostNames_[peer], ") left this group while it formed: its "
                        "process lives, but destroyed the group or failed to form it; see that rank's log"));
      };
    };
    if (cfg_.testFailForming)
      throwComm(str("rank ", rank, " failed to form the group on purpose (ROCE_PG_TEST_FAULT=fail_forming)"));
    connectLifelines(endpoints_, nonces_, deadline, probe);
  }

  routes_.assign(size, nullptr);
  const bool useShm = !cfg_.forceNetwork && topo_.localRanks.size() > 1;
  if (useShm) {
    nodeShm_ = std::make_unique<NodeShm>(bs, topo_.localRanks, topo_.localIndex, cfg_.shmRingBytes,
                                         cfg_.shmSlotBytes, deadline, timeout_);
    transports_.push_back(std::make_unique<ShmTransport>(rank, size, *nodeShm_, topo_.localRanks, &wakeup_));
    if (topo_.allLocal()) collectiveTagWord_ = &nodeShm_->control(topo_.localIndex)->collectiveTag;
    for (int r : topo_.localRanks)
      if (r != rank) routes_[r] = transports_.back().get();
  }
  // Peers not served by shared memory go over the network.
  std::vector<bool> viaNet(size, false);
  int netPeers = 0;
  for (int r = 0; r < size; ++r) {
    if (r == rank || routes_[r]) continue;
    viaNet[r] = true;
    ++netPeers;
  }
  const bool anyNet = netPeers > 0;
  const std::string& net = roster.network;
  if (anyNet && net == "verbs") {
    // Every rank sets up as many queue pairs per connection as the rank with
    // the most ports needs (both ends of a connection must agree).
    int maxRails = 1;
    for (const auto& info : infos) maxRails = std::max(maxRails, info.verbsRails);
    transports_.push_back(
        std::make_unique<VerbsTransport>(rank, size, verbsRails_, cfg_, groupQueuePairs(cfg_, maxRails), netPeers));
  } else if (anyNet) {
    transports_.push_back(std::make_unique<TcpTransport>(
        rank, size, hostNames_, [this](int r) { return processKeyOf(r); }, nonces_, &wakeup_));
  }
  for (int r = 0; r < size; ++r)
    if (viaNet[r]) routes_[r] = transports_.back().get();
  viaShm_.assign(size, false);
  for (int r = 0; r < size; ++r) viaShm_[r] = routes_[r] && !viaNet[r];
  for (auto& t : transports_) {
    t->setCounters(&counters_);
    t->setWakeup(&wakeup_);
    t->setPeerWatch([this](int peer) { return watchPeer(peer); });
  }
  if (anyNet) {
    // The mailbox stays open for the group's life: peers connect when they
    // first need this rank (TCP: the socket carries the data; verbs: it
    // carries the queue-pair handshake).
    connections_ = std::make_unique<ConnectionManager>(
        rank, net, endpoints_, hostNames_, nonces_, std::move(acceptor),
        [this](int peer, UniqueFd fd) { route(peer)->adoptConnection(peer, fd.release()); },
        [this](int peer, const std::string& why) { route(peer)->failPeer(peer, why); }, counters_);
    if (auto* tcp = dynamic_cast<TcpTransport*>(transports_.back().get())) {  // the network transport
      connections_->shareDials({[tcp](int peer) { return tcp->firstContact(peer); },
                                [tcp](int peer) { tcp->dialEnded(peer); },
                                [tcp](int peer) { tcp->useLink(peer); }});
    }
    if (cfg_.connect == "eager") connectAll(viaNet, deadline);
  }
  acceptor.reset();

  if (logLevel() >= LogLevel::Info && rank == 0) {
    std::string rdma;
    for (const auto& p : probeRdmaPorts())
      rdma += str(rdma.empty() ? "" : ", ", p.device, ":", p.port, " ", p.state, " ", p.linkLayer, " mtu ", p.activeMtu);
    ROCE_INFO("group of ", size, " ranks on ", topo_.numNodes, " node(s); rank 0 has ",
              topo_.localRanks.size(), " local rank(s); shared memory ", useShm ? "on" : "off",
              "; network transport ", anyNet ? net : "none",
              net == "verbs" ? str(" (", nicsText(), ")") : "", "; RDMA ports seen: ",
              rdma.empty() ? "none" : rdma, "; ", cfg_.describe());
  }
  // Formed: the mailbox gives up its descriptor and wakes the wait loops,
  // which look at it after announcing a sleep (wait_loop.cpp). Last: a throw
  // before here unwinds without ~Communicator, which clears the waker.
  if (mailbox_)  // none in a group of one
    mailbox_->box()->useWaker([this] { wakeup_.wake(); });
}

std::string Communicator::nicsText() const {
  std::string out;
  for (const auto& dev : verbsRails_) {
    const VerbsPortChoice& c = dev->choice();
    out += str(out.empty() ? "" : ", ", c.device, ":", c.port, c.numaNode >= 0 ? str(" (NUMA ", c.numaNode, ")") : "");
  }
  return out;
}

void Communicator::connectLifelines(const std::vector<TcpEndpoint>& eps, const std::vector<uint64_t>& nonces,
                                    Clock::time_point deadline,
                                    const std::function<std::function<void()>(int)>& probe) {
  // The ring neighbours (one of them for two ranks), reached over the links
  // between their processes: an open one (another group's, either side's
  // dial), else dialed now. No step waits for the neighbour to reach this
  // point; its first record may come much later (see firstContact).
  const auto& order = topo_.ringOrder;
  const int n = topo_.size;
  const int pos = topo_.ringIndexOf[rank()];
  std::vector<int> neighbours{order[(pos + 1) % n]};
  if (n > 2) neighbours.push_back(order[(pos + n - 1) % n]);
  ProcessLinks& hub = ProcessRuntime::get().links();
  std::vector<Lifeline::Link> links;
  for (int peer : neighbours)
    links.push_back({peer, hostNames_[peer], nonces[peer],
                     hub.linkTo(processKeyOf(peer), processKeyOf(rank()), eps[peer], peer, deadline, probe(peer))});
  // A subgroup formed from its parent is created at different moments on
  // different ranks (no join made them wait for each other; torch puts no
  // barrier after new_group): until a neighbour's first record, allow it the
  // group's timeout rather than the heartbeat's. A joined group's members
  // left the join together.
  const auto firstContact = fromParent_ ? timeout_ : std::chrono::milliseconds(cfg_.heartbeatTimeoutMs);
  lifeline_ = std::make_unique<Lifeline>(rank(), nonces[rank()], hostNames_[rank()], std::move(links),
                                         cfg_.heartbeatTimeoutMs, firstContact,
                                         [this](const std::string& why) { onPeerFailure(why); },
                                         // no leader compared the members' settings: the neighbours do
                                         settingsToCompare_);
  lifeline_->setStateProvider([this] { return progress_.snapshot(); });
  lifeline_->setGoneHandler([this] {
    peersGone_.store(true);
    wakeup_.wake();
  });
}

void Communicator::connectAll(const std::vector<bool>& viaNet, Clock::time_point deadline) {
  // ROCE_PG_CONNECT=eager: the full mesh at init. The lower rank of each pair
  // dials (no ties to resolve); everyone waits until all its peers are in.
  std::vector<int> peers;
  for (int r = 0; r < size(); ++r)
    if (viaNet[r]) peers.push_back(r);
  for (int r : peers)
    if (r > rank() && route(r)->needsConnection(r)) connections_->want(r);  // TCP: none if another group has one
  std::vector<pollfd> fds;
  for (;;) {
    // Announced before looking: another group's dial to a peer's process
    // ending (TCP's shared first contact) wakes this group's poll below.
    Wakeup::Announcement sleeping(wakeup_);
    connectionsReady_ = true;
    progress();  // the connections, and the transports' handshakes over them
    auto missing = std::find_if(peers.begin(), peers.end(), [&](int r) { return route(r)->needsConnection(r); });
    if (missing == peers.end()) return;
    if (Clock::now() >= deadline)
      throwTimeout(str("connecting rank ", rank(), " to every peer (ROCE_PG_CONNECT=eager) timed out after ",
                       timeout_.count(), " ms: ", connections_->status(*missing)));
    if (peerFailed_.load()) throwIfPeerFailed("connecting every peer (ROCE_PG_CONNECT=eager)");
    fds.clear();
    connections_->addPollFds(fds);
    if (wakeup_.valid()) fds.push_back({wakeup_.fd(), POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
  }
}

}  // namespace roce
