#include "communicator.hpp"

#include "../runtime/front_desk.hpp"

// Routing requests to transports, the operation context, and failure
// handling. Formation is in ../group/group_builder.cpp, waiting in wait_loop.cpp.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "../common/bytes.hpp"
#include "../common/error.hpp"
#include "../common/log.hpp"
#include "../transport/shm/node_shm.hpp"
#include "../transport/tcp/tcp_transport.hpp"
#include "../transport/verbs/verbs_device.hpp"
#include "connection_manager.hpp"
#include "../liveness/lifeline.hpp"

namespace roce::comm {
using namespace roce::runtime;
using namespace roce::transport::shm;
using namespace roce::transport::tcp;
using namespace roce::transport::verbs;
using namespace roce::liveness;

void Communicator::onPeerFailure(const std::string& why) {
  std::function<void(const std::string&)> hook;
  {
    std::lock_guard<std::mutex> g(abortMu_);
    if (peerFailed_.load()) return;
    peerFailure_ = why;
    peerFailedAt_ = Clock::now();
    hook = peerFailureHook_;
  }
  peerFailed_.store(true);
  wakeup_.wake();
  if (hook) hook(why);
}

void Communicator::setPeerFailureHook(std::function<void(const std::string&)> hook) {
  std::string already;
  {
    std::lock_guard<std::mutex> g(abortMu_);
    peerFailureHook_ = hook;
    if (peerFailed_.load()) already = peerFailure_;
  }
  if (!already.empty() && hook) hook(already);
}

std::string Communicator::processKeyOf(int r) const {
  const RankInfo& info = roster_.ranks.at(r);
  return ProcessLinks::processKey(info.hostId, info.tcpHost, info.tcpPort);
}

bool Communicator::watchPeer(int peer) {
  if (!lifeline_) return false;
  try {
    // Its process's link: open already (a lifeline neighbour's in some
    // group), or one the runtime thread dials now: this thread is inside an
    // operation and must not wait for a dial (a peer process that exited
    // right after connecting would hold it for the group's timeout; a
    // refused dial closes the link, which reports the peer gone).
    const int link = ProcessRuntime::get().links().linkSoon(processKeyOf(peer), processKeyOf(rank()), endpoints_[peer], peer);
    lifeline_->watch({peer, hostNames_[peer], nonces_[peer], link});
    return true;
  } catch (const std::exception& e) {
    ROCE_WARN("rank ", rank(), ": cannot watch rank ", peer, " over its process's link (", e.what(),
              "); keeping the connection's socket to see it leave");
    return false;
  }
}

void Communicator::failGonePeers() {
  if (!peersGone_.exchange(false) || !lifeline_) return;
  for (const auto& [peer, why] : lifeline_->takeGone())
    if (Transport* t = routes_.at(peer)) t->failPeer(peer, why);
}

void Communicator::leaveGracefully() {
  if (lifeline_) lifeline_->leave();
}

Communicator::Communicator(const Config& cfg, std::chrono::milliseconds timeout) : cfg_(cfg), timeout_(timeout) {}

Communicator::~Communicator() {
  // Before the wake-ups go: the desk's thread calls the waker (useWaker
  // returns once no call is in flight).
  if (mailbox_) mailbox_->box()->useWaker({});
}

std::string Communicator::nicsText() const {
  std::string out;
  for (const auto& dev : verbsRails_) {
    const VerbsPortChoice& c = dev->choice();
    out += str(out.empty() ? "" : ", ", c.device, ":", c.port, c.numaNode >= 0 ? str(" (NUMA ", c.numaNode, ")") : "");
  }
  return out;
}

bool Communicator::arrivalsPending() const { return mailbox_ && mailbox_->box()->pending(); }

int Communicator::networkPeers() const {
  int n = 0;
  for (size_t r = 0; r < routes_.size(); ++r) n += routes_[r] && !viaShm_[r];
  return n;
}

const char* Communicator::transportName(int peer) const {
  return routes_.at(peer) ? routes_[peer]->name() : "self";
}

bool Communicator::registersDmabuf(int peer, std::string* why) const {
  if (!routes_.at(peer)) return *why = "no transport", false;
  return routes_[peer]->registersDmabuf(why);
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
    std::string why;
    {
      std::lock_guard<std::mutex> g(abortMu_);
      why = peerFailure_;
    }
    // Through breakWith: the transports must drop every request they hold
    // before the engine fails (and frees) the tasks that own them.
    breakWith(why, /*tellPeers=*/false);
  }
  if (!broken_.empty())
    throwComm(str(opName(), " refused: this process group failed earlier and cannot be used any more (",
                  broken_, "). Destroy it and create a new one"));
  if (!settingsAgreed_ && lifeline_) {
    // A group formed from its parent: its first operation runs only once the
    // neighbours confirmed equal settings (Lifeline::awaitSettings), never
    // with mismatched message patterns.
    const auto verdict = lifeline_->awaitSettings(std::min(deadline_, Clock::now() + timeout_),
                                                  [this] { return abortRequested_.load(); });
    if (!verdict.agreed) {
      if (abortRequested_.load())
        throw Error(ErrorKind::Aborted, str("roce: ", opName(), " on rank ", rank(), " was aborted: ", abortReason_));
      const std::string dropped =
          verdict.recordsDropped == 0 ? ""
          : str("; or their settings were among the ", verdict.recordsDropped, " lifeline records this process "
                "dropped since the group formed, for groups it had not created yet (the parking budget "
                "ROCE_PG_NET_PARKED_RECORD_BYTES was full: a flood from the network? net_records_dropped)");
      throwComm(str(opName(), " on rank ", rank(), " failed: ", verdict.failure.empty() ? str("the group's ring "
                    "neighbours did not confirm their settings within the timeout (they did not create the group",
                    dropped, ")") : verdict.failure));
    }
    settingsAgreed_ = true;
  }
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

bool Communicator::deviceBuffers() const {
  for (const BufferOwner& o : taskOwners_)
    if (o.device) return true;
  return false;
}

void Communicator::copyLocal(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  for (const BufferOwner& o : taskOwners_) {
    if (!o.device || !(o.covers(dst, bytes) || o.covers(src, bytes))) continue;
    if (!deviceCopy_)
      throw std::logic_error("roce: an algorithm copied device memory but the operation gave no device copy");
    return deviceCopy_(dst, src, bytes);
  }
  moveBytes(dst, src, bytes);
}

void Communicator::attachOwner(Request& r) const {
  // A zero-length message touches no memory: it goes without an owner on
  // both sides, device memory or not (no registration for nothing).
  if (r.len == 0) return;
  // Below the zero-copy threshold no transport registers host buffers; device
  // memory (GPUDirect) always goes with its owner: the CPU must not touch it.
  const bool small = cfg_.verbs.zeroCopyMinBytes == 0 || r.len < cfg_.verbs.zeroCopyMinBytes;
  for (const BufferOwner& o : taskOwners_)
    if ((o.device || !small) && o.covers(r.buf, r.len)) { r.owner = o; return; }
  if (small) return;
  scratch_.ownerOf(r.buf, r.len, r.owner);
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
  } else if (r.kind == Request::Kind::Write || r.kind == Request::Kind::Read) {
    Counters::add(r.kind == Request::Kind::Write ? counters_.bytesWritten : counters_.bytesRead, r.len);
    t->postOneSided(&r);
  } else {
    t->postRecv(&r);
  }
}

std::unique_ptr<ExposedMemory> Communicator::expose(const std::vector<int>& peers, void* base, size_t len,
                                                    std::string* why) {
  if (peers.empty()) return *why = "no peer to expose it to", nullptr;
  Transport* t = route(peers[0]);
  for (int p : peers)
    if (route(p) != t)
      return *why = str("rank ", p, " is reached by ", route(p)->name(), ", rank ", peers[0], " by ", t->name()),
             nullptr;
  return t->expose(base, len, why);
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

void Communicator::throwFailure(const std::string& msg, bool peerEnded) {
  // A connection that broke is often the echo of an earlier failure (the rank
  // that saw it first tore its group down): name that root cause too. Only a
  // peer's deliberate end waits for it (any other failure is news of its own,
  // and its rank should tell the group at once), never past an abort or the
  // operation's deadline.
  if (peerEnded && lifeline_) {
    const auto until = std::min(Clock::now() + kRootCauseWait, deadline_);
    while (!peerFailed_.load() && !abortRequested_.load() && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string cause;
  if (peerFailed_.load()) {
    std::lock_guard<std::mutex> g(abortMu_);
    cause = peerFailure_;
  }
  if (!cause.empty() && msg.find(cause) == std::string::npos)
    throwComm(str(opName(), " on rank ", rank(), " failed: ", msg, " (first failure reported in the group: ", cause, ")"));
  throwComm(str(opName(), " on rank ", rank(), " failed: ", msg));
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

void Communicator::announceDeparture(const std::string& why) {
  if (lifeline_) lifeline_->announceFailure(str("rank ", rank(), " (host ", hostNames_[rank()], ") left: ", why));
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

}  // namespace roce::comm
