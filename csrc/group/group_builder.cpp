// How a group forms (group_builder.hpp): joining the group's leader
// (join.hpp) or deriving from the parent's roster, lifelines to the ring
// neighbours, shared memory with the ranks of this machine, the network
// transport (its connections made on demand, or all at once with
// ROCE_PG_CONNECT=eager). See docs/ARCHITECTURE.md, "How a group forms".
#include "group_builder.hpp"

#include <cstdint>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "../common/error.hpp"
#include "../common/sockets.hpp"
#include "../common/hex.hpp"
#include "../common/log.hpp"
#include "../common/random.hpp"
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

namespace roce::group {
using namespace roce::transport::shm;
using namespace roce::runtime;
using namespace roce::transport::tcp;
using namespace roce::transport::verbs;
using namespace roce::comm;
using namespace roce::liveness;
using namespace roce::membership;

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
  void checkCancelled() override { inner_.checkCancelled(); }

 private:
  Bootstrap& inner_;
  int& count_;
};

}  // namespace

std::unique_ptr<Communicator> GroupBuilder::join(Bootstrap& outerStore, const Config& cfg, int rank, int size,
                                                 int globalRank, std::chrono::milliseconds timeout) {
  std::unique_ptr<Communicator> made(new Communicator(cfg, timeout));
  Communicator& c = *made;
  const auto deadline = Clock::now() + c.timeout_;
  CountingBootstrap store(outerStore, c.formationStoreOps_);
  raiseDescriptorLimit();
  RankInfo me;
  me.hostId = localHostId();
  me.nodeId = !c.cfg_.placement.simNode.empty()       ? str("sim-node-", c.cfg_.placement.simNode, "@", me.hostId)
              : c.cfg_.placement.simRanksPerNode > 0 ? str("sim-node-", globalRank / c.cfg_.placement.simRanksPerNode, "@", me.hostId)
                                         : me.hostId;
  me.pid = getpid();
  me.nonce = randomNonce();
  me.shmRingBytes = c.cfg_.shm.ringBytes;
  me.shmSlotBytes = c.cfg_.shm.slotBytes;
  me.algorithms = c.cfg_.algorithmSettings();
  me.cpus = Config::usableCpus();
  if (size > 1) {
    // The process's one listener; connections naming this rank's nonce come
    // to this group's mailbox (runtime/front_desk.hpp).
    FrontDesk& desk = ProcessRuntime::get().desk();
    c.mailbox_ = std::make_unique<MailboxLease>(desk, me.nonce);
    me.tcpHost = tcpAdvertiseAddress(c.cfg_);
    me.tcpPort = desk.listen(me.tcpHost);
    if (c.cfg_.placement.netTransport != NetTransport::Tcp) {
      // Open the RDMA ports now, so the leader can tell whether every rank has one.
      // A port that cannot be opened is left out (said at INFO); none at all is what noVerbsWhy tells.
      std::string failed;
      for (const auto& choice : chooseVerbsPorts(c.cfg_, globalRank, me.noVerbsWhy)) {
        try {
          c.verbsRails_.push_back(VerbsDevice::shared(choice, c.cfg_));  // one per port per process
        } catch (const Error& e) {
          failed += str(failed.empty() ? "" : "; ", e.what());
        }
      }
      if (!failed.empty() && c.verbsRails_.empty()) me.noVerbsWhy = failed;
      else if (!failed.empty()) ROCE_INFO("rank ", globalRank, ": RDMA ports left out: ", failed);
      me.verbsRails = static_cast<int>(c.verbsRails_.size());
    } else {
      me.noVerbsWhy = "ROCE_PG_NET_TRANSPORT=tcp";
    }
  }
  // A group of one needs nobody and touches no store key.
  Joined joined = size > 1 ? joinGroup(store, *c.mailbox_->box(), rank, size, me, c.cfg_, deadline, c.timeout_)
                           : Joined{planGroup(c.cfg_, {me}), ""};
  form(c, store, std::move(joined.roster), joined.incarnation, rank, deadline);
  return made;
}

GroupBuilder::ParentView GroupBuilder::parentView(const Communicator& parent) {
  return {parent.roster_, parent.rank(), parent.verbsRails_};
}

std::unique_ptr<Communicator> GroupBuilder::derive(const ParentView& parent, Bootstrap& outerStore,
                                                   const Config& cfg, int rank, const std::vector<int>& parentRanks,
                                                   const std::string& groupName, std::chrono::milliseconds timeout) {
  std::unique_ptr<Communicator> made(new Communicator(cfg, timeout));
  Communicator& c = *made;
  const auto deadline = Clock::now() + c.timeout_;
  CountingBootstrap store(outerStore, c.formationStoreOps_);
  c.fromParent_ = true;
  // As set, before form() resolves auto values (the neighbours compare these).
  c.settingsToCompare_ = c.cfg_.algorithmSettings();
  Roster roster = deriveRoster(c.cfg_, parent.roster, parentRanks, groupName);
  if (rank < 0 || rank >= static_cast<int>(roster.ranks.size()) || parentRanks[rank] != parent.rank)
    throwInvalid(str("subgroup rank ", rank, " is not this process's parent rank ", parent.rank));
  // The parent's ports, less those that went down since (a port back up is
  // opened afresh): a subgroup or shrink formed after a port failure goes on
  // the ports still up. With none left it keeps them, and fails naming them.
  for (const auto& dev : parent.rails)
    if (auto live = VerbsDevice::renewed(dev, c.cfg_)) c.verbsRails_.push_back(std::move(live));
  if (c.verbsRails_.empty()) c.verbsRails_ = parent.rails;
  if (roster.ranks.size() > 1)
    c.mailbox_ = std::make_unique<MailboxLease>(ProcessRuntime::get().desk(), roster.ranks[rank].nonce);
  const std::string incarnation = hex64(roster.ranks[0].nonce);
  form(c, store, std::move(roster), incarnation, rank, deadline);
  return made;
}

void GroupBuilder::form(Communicator& c, Bootstrap& store, Roster formed, const std::string& incarnation, int myRank,
                        Clock::time_point deadline) {
  c.roster_ = std::move(formed);
  const Roster& roster = c.roster_;
  ScopedBootstrap bs(store, str("roce/", incarnation, "/"));  // this incarnation's keys
  const std::vector<RankInfo>& infos = roster.ranks;
  c.topo_ = Topology::build(myRank, infos);
  const int rank = myRank, size = static_cast<int>(infos.size());
  const RankInfo& me = infos[rank];
  for (const auto& info : infos) c.hostNames_.push_back(info.hostName());
  c.cfg_.algo.nChannels = roster.channels;
  // This rank's share of the machine's CPUs (the real machine: simulated
  // nodes split one host but not its cores). Peers never depend on it.
  const int onHost = static_cast<int>(
      std::count_if(infos.begin(), infos.end(), [&](const RankInfo& i) { return i.hostId == me.hostId; }));
  const int cpus = me.cpus;
  // Auto is resolved once per process, by its first group (normally the
  // world): a later subgroup with fewer ranks here still shares the machine
  // with the others, and must not grow the pool past their share.
  static const int autoWorkers = Config::workersAuto(cpus, onHost);
  if (c.cfg_.workers == 0) c.cfg_.workers = autoWorkers;
  // The pool's threads are created here, on the thread creating the group,
  // so they inherit its CPU affinity (docs/ARCHITECTURE.md, "Worker
  // threads"). Spinning between jobs only pays when every thread has a core
  // of its own; with more threads than CPUs a spinning worker takes the core
  // a peer rank needs (measured: +20% CPU per GB with 2 ranks x 2 workers on
  // 2 cores, docs/PERFORMANCE.md).
  const bool ownCores = c.cfg_.workers * onHost <= cpus;
  if (c.cfg_.workers > 1 && size > 1) WorkerPool::process().ensureThreads(c.cfg_.workers - 1, ownCores ? c.cfg_.spinUs : 0);
  c.cfg_.placement.forceNetwork = roster.forceNetwork;
  c.endpoints_.resize(size);
  for (int r = 0; r < size; ++r) {
    c.endpoints_[r] = {infos[r].hostId == me.hostId ? std::string(kLoopbackAddress) : infos[r].tcpHost, infos[r].tcpPort};
    c.nonces_.push_back(infos[r].nonce);
  }
  std::unique_ptr<TcpAcceptor> acceptor;
  if (size > 1) {
    acceptor = std::make_unique<TcpAcceptor>(c.mailbox_->box(), rank, c.nonces_);
    // While waiting for a neighbour's lifeline: every rank's listener was open
    // before it joined, so one that refuses connections means that rank is
    // gone (it exited after joining), and waiting longer cannot help.
    // Its process lives on after a failed or destroyed group (the listener is
    // the process's), so ask its front desk whether the group is still there.
    auto probe = [&c](int peer) {
      return [&c, peer] {
        const PeerState s = probePeer(c.endpoints_[peer], c.rank(), peer, c.nonces_[c.rank()], c.nonces_[peer]);
        if (s == PeerState::ProcessGone)
          throwComm(str("rank ", peer, " (host ", c.hostNames_[peer], ", ", c.endpoints_[peer].host, ":",
                        c.endpoints_[peer].port, ") is gone: its listener refuses connections. It exited after "
                        "joining the group; see that rank's log"));
        if (s == PeerState::GroupGone)
          throwComm(str("rank ", peer, " (host ", c.hostNames_[peer], ") left this group while it formed: its "
                        "process lives, but destroyed the group or failed to form it; see that rank's log"));
      };
    };
    if (c.cfg_.testFailForming)
      throwComm(str("rank ", rank, " failed to form the group on purpose (ROCE_PG_TEST_FAULT=fail_forming)"));
    connectLifelines(c, c.endpoints_, c.nonces_, deadline, probe);
  }

  c.routes_.assign(size, nullptr);
  const bool useShm = !c.cfg_.placement.forceNetwork && c.topo_.localRanks.size() > 1;
  if (useShm) {
    c.nodeShm_ = std::make_unique<NodeShm>(bs, c.topo_.localRanks, c.topo_.localIndex, c.cfg_.shm.ringBytes,
                                         c.cfg_.shm.slotBytes, deadline, c.timeout_);
    c.transports_.push_back(std::make_unique<ShmTransport>(rank, size, *c.nodeShm_, c.topo_.localRanks, &c.wakeup_));
    if (c.topo_.allLocal()) c.collectiveTagWord_ = &c.nodeShm_->control(c.topo_.localIndex)->collectiveTag;
    for (int r : c.topo_.localRanks)
      if (r != rank) c.routes_[r] = c.transports_.back().get();
  }
  // Peers not served by shared memory go over the network.
  std::vector<bool> viaNet(size, false);
  int netPeers = 0;
  for (int r = 0; r < size; ++r) {
    if (r == rank || c.routes_[r]) continue;
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
    c.transports_.push_back(
        std::make_unique<VerbsTransport>(rank, size, c.verbsRails_, c.cfg_, groupQueuePairs(c.cfg_, maxRails), netPeers));
  } else if (anyNet) {
    c.transports_.push_back(std::make_unique<TcpTransport>(
        rank, size, c.hostNames_, [comm = &c](int r) { return comm->processKeyOf(r); }, c.nonces_, &c.wakeup_));
  }
  for (int r = 0; r < size; ++r)
    if (viaNet[r]) c.routes_[r] = c.transports_.back().get();
  c.viaShm_.assign(size, false);
  for (int r = 0; r < size; ++r) c.viaShm_[r] = c.routes_[r] && !viaNet[r];
  for (auto& t : c.transports_) {
    t->setCounters(&c.counters_);
    t->setWakeup(&c.wakeup_);
    t->setPeerWatch([comm = &c](int peer) { return comm->watchPeer(peer); });
  }
  if (anyNet) {
    // The mailbox stays open for the group's life: peers connect when they
    // first need this rank (TCP: the socket carries the data; verbs: it
    // carries the queue-pair handshake).
    c.connections_ = std::make_unique<ConnectionManager>(
        rank, net, c.endpoints_, c.hostNames_, c.nonces_, std::move(acceptor),
        [comm = &c](int peer, UniqueFd fd) { comm->route(peer)->adoptConnection(peer, fd.release()); },
        [comm = &c](int peer, const std::string& why) { comm->route(peer)->failPeer(peer, why); }, c.counters_);
    if (auto* tcp = dynamic_cast<TcpTransport*>(c.transports_.back().get())) {  // the network transport
      c.connections_->shareDials({[tcp](int peer) { return tcp->firstContact(peer); },
                                [tcp](int peer) { tcp->dialEnded(peer); },
                                [tcp](int peer) { tcp->useLink(peer); }});
    }
    if (c.cfg_.connect == ConnectMode::Eager) connectAll(c, viaNet, deadline);
  }
  acceptor.reset();

  if (logLevel() >= LogLevel::Info && rank == 0) {
    std::string rdma;
    for (const auto& p : probeRdmaPorts())
      rdma += str(rdma.empty() ? "" : ", ", p.device, ":", p.port, " ", p.state, " ", p.linkLayer, " mtu ", p.activeMtu);
    ROCE_INFO("group of ", size, " ranks on ", c.topo_.numNodes, " node(s); rank 0 has ",
              c.topo_.localRanks.size(), " local rank(s); shared memory ", useShm ? "on" : "off",
              "; network transport ", anyNet ? net : "none",
              net == "verbs" ? str(" (", c.nicsText(), ")") : "", "; RDMA ports seen: ",
              rdma.empty() ? "none" : rdma, "; ", c.cfg_.describe());
  }
  // Formed: the mailbox gives up its descriptor and wakes the wait loops,
  // which look at it after announcing a sleep (wait_loop.cpp). Last, so that
  // no wake reaches a group still forming (~Communicator clears the waker).
  if (c.mailbox_)  // none in a group of one
    c.mailbox_->box()->useWaker([comm = &c] { comm->wakeup_.wake(); });
}

void GroupBuilder::connectLifelines(Communicator& c, const std::vector<TcpEndpoint>& eps, const std::vector<uint64_t>& nonces,
                                    Clock::time_point deadline,
                                    const std::function<std::function<void()>(int)>& probe) {
  // The ring neighbours (one of them for two ranks), reached over the links
  // between their processes: an open one (another group's, either side's
  // dial), else dialed now. No step waits for the neighbour to reach this
  // point; its first record may come much later (see firstContact).
  const auto& order = c.topo_.ringOrder;
  const int n = c.topo_.size;
  const int pos = c.topo_.ringIndexOf[c.rank()];
  std::vector<int> neighbours{order[(pos + 1) % n]};
  if (n > 2) neighbours.push_back(order[(pos + n - 1) % n]);
  ProcessLinks& hub = ProcessRuntime::get().links();
  std::vector<Lifeline::Link> links;
  for (int peer : neighbours)
    links.push_back({peer, c.hostNames_[peer], nonces[peer],
                     hub.linkTo(c.processKeyOf(peer), c.processKeyOf(c.rank()), eps[peer], peer, deadline, probe(peer))});
  // A subgroup formed from its parent is created at different moments on
  // different ranks (no join made them wait for each other; torch puts no
  // barrier after new_group): until a neighbour's first record, allow it the
  // group's timeout rather than the heartbeat's. A joined group's members
  // left the join together.
  const auto firstContact = c.fromParent_ ? c.timeout_ : std::chrono::milliseconds(c.cfg_.heartbeatTimeoutMs);
  hub.countGroup(nonces[c.rank()], static_cast<size_t>(c.size()));
  c.lifeline_ = std::make_unique<Lifeline>(c.rank(), nonces[c.rank()], c.hostNames_[c.rank()], std::move(links),
                                         c.cfg_.heartbeatTimeoutMs, firstContact,
                                         [comm = &c](const std::string& why) { comm->onPeerFailure(why); },
                                         // no leader compared the members' settings: the neighbours do
                                         c.settingsToCompare_);
  c.lifeline_->setStateProvider([comm = &c] { return comm->progress_.snapshot(); });
  c.lifeline_->setGoneHandler([comm = &c] {
    comm->peersGone_.store(true);
    comm->wakeup_.wake();
  });
}

void GroupBuilder::connectAll(Communicator& c, const std::vector<bool>& viaNet, Clock::time_point deadline) {
  // ROCE_PG_CONNECT=eager: the full mesh at init. The lower rank of each pair
  // dials (no ties to resolve); everyone waits until all its peers are in.
  std::vector<int> peers;
  for (int r = 0; r < c.size(); ++r)
    if (viaNet[r]) peers.push_back(r);
  for (int r : peers)
    if (r > c.rank() && c.route(r)->needsConnection(r)) c.connections_->want(r);  // TCP: none if another group has one
  std::vector<pollfd> fds;
  for (;;) {
    // Announced before looking: another group's dial to a peer's process
    // ending (TCP's shared first contact) wakes this group's poll below.
    Wakeup::Announcement sleeping(c.wakeup_);
    c.connectionsReady_ = true;
    c.progress();  // the connections, and the transports' handshakes over them
    auto missing = std::find_if(peers.begin(), peers.end(), [&](int r) { return c.route(r)->needsConnection(r); });
    if (missing == peers.end()) return;
    if (Clock::now() >= deadline)
      throwTimeout(str("connecting rank ", c.rank(), " to every peer (ROCE_PG_CONNECT=eager) timed out after ",
                       c.timeout_.count(), " ms: ", c.connections_->status(*missing)));
    if (c.peerFailed_.load()) c.throwIfPeerFailed("connecting every peer (ROCE_PG_CONNECT=eager)");
    fds.clear();
    c.connections_->addPollFds(fds);
    if (c.wakeup_.valid()) fds.push_back({c.wakeup_.fd(), POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
  }
}

}  // namespace roce::group
