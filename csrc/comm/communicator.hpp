// What the collective algorithms see of the network: a rank, a size, a
// topology, and point-to-point Requests that it routes to whichever transport
// serves each peer (shared memory on the same machine, verbs or TCP
// elsewhere: ROCE_PG_NET_TRANSPORT). It also
// owns the single wait loop, so timeouts, peer failures and cross-rank abort
// notices behave the same in every algorithm.
//
// Used by one thread at a time (construction excepted): the group's progress
// thread, or the caller's thread while the engine runs a small collective
// inline (Engine::runInline) with the progress thread parked.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../common/backoff.hpp"
#include "algorithm_state.hpp"
#include "scratch_buffers.hpp"
#include "../common/bootstrap.hpp"
#include "../common/config.hpp"
#include "../common/describable.hpp"
#include "../common/counters.hpp"
#include "../common/helper_thread.hpp"
#include "../common/wakeup.hpp"
#include "../transport/transport.hpp"
#include "../liveness/op_progress.hpp"
#include "../membership/roster.hpp"
#include "../membership/topology.hpp"
#include "../runtime/connect.hpp"

namespace roce::group {
class GroupBuilder;
}
namespace roce::liveness {
class Lifeline;
}
namespace roce::runtime {
class MailboxLease;
class TcpAcceptor;
}
namespace roce::transport::shm {
class NodeShm;
}
namespace roce::transport::verbs {
class VerbsDevice;
}
namespace roce::comm {
using namespace roce::transport::verbs;
using namespace roce::transport::shm;
using namespace roce::transport;
using namespace roce::liveness;
using namespace roce::membership;
using namespace roce::runtime;

class ConnectionManager;

// Made only by GroupBuilder (group/group_builder.hpp), which forms the group
// and hands it over ready.
class Communicator {
 public:
  ~Communicator();
  // Store operations this group's formation made (tests count them).
  int formationStoreOps() const { return formationStoreOps_; }

  int rank() const { return topo_.rank; }
  int size() const { return topo_.size; }
  // Peers reached over the network transport (not shared memory, not self).
  int networkPeers() const;
  const Topology& topology() const { return topo_; }
  const Config& config() const { return cfg_; }
  // Non-null when every rank of the group shares this machine's memory.
  NodeShm* nodeShm() const { return topo_.allLocal() ? nodeShm_.get() : nullptr; }
  const char* transportName(int peer) const;
  // Whether the transport serving `peer` registers dma-bufs (Transport::registersDmabuf).
  bool registersDmabuf(int peer, std::string* why) const;
  // Traffic statistics; safe to read from any thread.
  Counters& counters() { return counters_; }
  // What this rank last issued, started and ended; safe from any thread.
  OpProgress& opProgress() { return progress_; }
  // At a failure: every rank's state, collected over the lifelines (at most
  // kVerdictWait), as one verdict naming who is behind (verdict.hpp); empty
  // without lifelines. Every rank gets the same text.
  std::string verdict();
  static constexpr std::chrono::milliseconds kVerdictWait{2000};

  // --- per-operation context -------------------------------------------------
  // Names the running operation in error messages and sets its deadline.
  void beginOperation(const std::string& what, Clock::time_point deadline);
  // The same, naming it lazily: `what` is described only if a message needs
  // it, and must stay alive until endOperation().
  void beginOperation(const Describable& what, Clock::time_point deadline);
  void endOperation();
  // The next collective's tag, the same on every rank that runs the same
  // collectives in the same order. In a group on one machine it is also
  // published in this rank's control page (ShmRankControl::collectiveTag).
  // Release: a peer that sees it sees this rank's earlier barrier arrivals.
  uint64_t nextCollectiveTag() {
    ++collectiveSeq_;
    if (collectiveTagWord_) collectiveTagWord_->store(collectiveSeq_ << 1, std::memory_order_release);
    return collectiveSeq_;
  }
  // The shared-memory barrier's tag: the one the next message collective
  // will take, published with bit 0 set but not taken. The barrier sends no
  // message and, like the shared-memory collectives, takes no tag, so the
  // ranks' sequences stay in step also after it fails as a mismatch that
  // leaves the group usable.
  uint64_t barrierTag() {
    const uint64_t tag = collectiveSeq_ + 1;
    if (collectiveTagWord_) collectiveTagWord_->store(tag << 1 | 1, std::memory_order_release);
    return tag;
  }
  static uint64_t p2pTag(int userTag) { return (1ull << 63) | static_cast<uint32_t>(userTag); }

  // --- point to point --------------------------------------------------------
  // Creates a request owned by the communicator and posts it. Algorithms use
  // only these: a request stays alive until the next operation begins and every
  // earlier request has finished or been failed, so a wait that throws can never
  // leave a transport pointing into freed memory (failing the communicator makes
  // the transports drop their pointers while the requests still exist).
  // `lane`: see Request::lane (channels of a collective).
  Request* post(Request::Kind kind, int peer, uint64_t tag, void* buf, size_t len, uint8_t lane = 0);
  // Posts a request owned by the caller (point-to-point tasks keep theirs alive
  // until they complete).
  void post(Request& r);
  // True while a request created by post(kind, ...) is unfinished (a transport may hold it).
  bool hasPendingRequests() const;
  // One-sided access: exposes [base, base + len) for writes by `peers`
  // through the transport that serves them all (Transport::expose), or null
  // with why. A Request of Kind::Write or Read goes through post() like the rest.
  std::unique_ptr<ExposedMemory> expose(const std::vector<int>& peers, void* base, size_t len, std::string* why);
  void postRecvAnySource(Request& r);  // r.peer is set once a sender is chosen
  bool progress();
  // Blocks until all requests are done; throws on the first failure, on the
  // deadline, on abort, or when another rank reported a failure.
  void waitAll(Request* const* reqs, size_t n);
  void wait(Request& r) { Request* p = &r; waitAll(&p, 1); }
  // Generic form: `done` is polled; `waitingFor` names what is missing for errors.
  // `block`, when given, is called instead of backing off when nothing moved:
  // it may sleep on a futex for a bounded time (shared-memory waits).
  // Otherwise a wait spins for ROCE_PG_SPIN_US, then blocks until a transport
  // has activity (blockUntilActivity), so it neither sleeps through an arrival
  // nor burns a core that another rank needs.
  void waitUntil(const std::function<bool()>& done, const std::function<std::string()>& waitingFor,
                 const std::function<void()>& block = nullptr);
  // Blocks until a transport may have progress to make (a socket readable or
  // writable, a completion on the CQ, a local peer rang the shared-memory
  // doorbell), wake() is called, the operation's deadline or the next slow
  // check is due. `interrupt` is re-checked once the wait is announced (the
  // engine passes "work was queued"). Returns Cannot without blocking when
  // some transport has pending work it cannot announce (shared-memory rings
  // without a usable doorbell): the caller then backs off by polling.
  enum class Blocked { Cannot, Moved, Slept };  // Moved: found work (or a wake reason) before sleeping
  Blocked blockUntilActivity(const std::function<bool()>& interrupt = nullptr);
  // Interrupts blockUntilActivity from another thread; cheap when nobody blocks.
  void wake() { wakeup_.wake(); }
  // While it lives, blockUntilActivity also wakes when `fd` turns readable:
  // a one-shot notice from outside the transports (a device's work done,
  // torch/device_notify.hpp) that stays readable once signalled, so no
  // announcement is needed and none is lost. One at a time.
  class WakeOnFd {
   public:
    WakeOnFd(Communicator& c, int fd) : c_(c) { c_.extraWaitFd_ = fd; }
    ~WakeOnFd() { c_.extraWaitFd_ = -1; }
    WakeOnFd(const WakeOnFd&) = delete;
    WakeOnFd& operator=(const WakeOnFd&) = delete;

   private:
    Communicator& c_;
  };
  // --- the engine with nothing to run ---------------------------------------
  // Peers may connect to this rank at any time (connections on demand), so an
  // idle engine keeps answering them instead of sleeping on its condition
  // variable: announceIdle() under the engine's lock (it also collects the
  // sockets to watch), then waitIdle() without it (returns on wakeIdle() or
  // socket activity), then serveConnections() under the lock again (no inline
  // operation runs meanwhile).
  // The idle wait shares wakeup_ with blockUntilActivity, which an inline
  // operation may run at the same time on the caller's thread: Wakeup serves
  // two waiters, each re-checking its own conditions on every wake.
  // Called once, on the runtime thread, when the lifelines report that the
  // group failed elsewhere (what a parked group learns with nothing in
  // flight: the adapter fails its windows' waits). Any thread.
  void setPeerFailureHook(std::function<void(const std::string&)> hook);
  bool answersConnections() const { return connections_ != nullptr; }
  // `transports`: the engine serves peers while parked (a window's service),
  // so the wait watches the transports too; endIdleWait() ends their wait
  // (afterWait), on the engine's thread after waitIdle or on a caller's that
  // takes over the communicator for an inline operation, whichever first.
  void announceIdle(bool transports);
  void endIdleWait();
  void wakeIdle() { wakeup_.wake(); }
  void waitIdle(bool sleep = true);  // sleep=false: only ends the announcement
  void serveConnections();
  // A wait loop's state across rounds in which nothing moved.
  struct IdleWait {
    bool idle = false;  // nothing moved since `since`
    Clock::time_point since{};
    Backoff backoff;    // only for waits no descriptor can announce
    void moved() {
      idle = false;
      backoff.reset();
    }
  };
  // One round of a wait in which nothing moved: spin for ROCE_PG_SPIN_US, then
  // block until activity, or back off where nothing can be blocked on. True
  // when the round waited long enough for the slow checks to be worth it.
  bool idleRound(IdleWait& w, const std::function<bool()>& interrupt = nullptr);

  // Checks that need no peers: deadline and abort flag.
  void checkDeadline(const std::function<std::string()>& waitingFor);
  // For asynchronous point-to-point work polled outside any wait: throws if a
  // peer failure was reported (lifelines, transports, the store), throttled.
  void checkHealth();
  // The same for an asynchronous task with its own name and deadline, without
  // touching the running collective's name and deadline.
  void checkTaskDeadline(const std::string& what, Clock::time_point deadline, std::chrono::milliseconds timeout);

  // --- failure handling ------------------------------------------------------
  // After a failure mid-operation the peers' message streams can no longer be
  // trusted: fail everything pending, refuse further work, and tell the other
  // ranks through the store so they stop waiting instead of timing out.
  // tellPeers=false for local shutdown/abort, which is not the peers' failure.
  void breakWith(const std::string& reason, bool tellPeers = true);
  const std::string& brokenReason() const { return broken_; }
  void requestAbort(const std::string& why);  // thread-safe
  // Before an abort the program chose (a reconfigure): the notice the
  // neighbours get names `why` instead of an unexplained abort. Thread-safe.
  void announceDeparture(const std::string& why);
  // An orderly exit (shutdown): tells the neighbours this rank leaves on purpose.
  void leaveGracefully();
  // Called periodically during long waits (lets the engine finish async work).
  std::function<void()> idleHook;

  // Channels of large collectives (ROCE_PG_NCHANNELS, resolved for the group).
  int channels() const { return cfg_.algo.nChannels; }
  // The RDMA ports this rank drives, "rxe0:1 (NUMA 0), rxe1:1" (empty without
  // verbs): the doctor's and the init log's rank -> NIC mapping.
  std::string nicsText() const;
  // The helper thread that reduces for channel index+1 (created on first use,
  // kept for the group's life). Waits in waitUntil() wake when a job ends.
  HelperThread& helper(int index);

  // Threads this rank's local copies and reductions are split over (the
  // caller plus workers()-1 of WorkerPool::process(); ROCE_PG_WORKERS, resolved).
  int workers() const { return cfg_.workers; }

  // Scratch memory reused across operations (index selects an independent buffer).
  void* scratch(size_t bytes, int index = 0) { return scratch_.get(bytes, index); }

  // The allocations the running operation's buffers live in (the torch
  // adapter passes the tensors' storages). post(kind, ...) attaches the one
  // covering a request's buffer, or a scratch block, to Request::owner, so a
  // zero-copy transport may register it (see BufferOwner). Cleared by the
  // returned guard when the operation's body ends.
  //
  // Device memory among them (BufferOwner::device, GPUDirect) must never be
  // touched by the CPU: the algorithms copy their own blocks with copyLocal(),
  // which hands such copies to `deviceCopy` (the adapter's: a copy on the
  // device, complete when it returns).
  using DeviceCopy = std::function<void(void* dst, const void* src, size_t bytes)>;
  class OwnersScope {
   public:
    explicit OwnersScope(Communicator& c) : c_(c) {}
    ~OwnersScope() {
      c_.taskOwners_.clear();
      c_.deviceCopy_ = nullptr;
    }
    OwnersScope(const OwnersScope&) = delete;
    OwnersScope& operator=(const OwnersScope&) = delete;
   private:
    Communicator& c_;
  };
  [[nodiscard]] OwnersScope useBufferOwners(std::vector<BufferOwner> owners, DeviceCopy deviceCopy = nullptr) {
    taskOwners_ = std::move(owners);
    deviceCopy_ = std::move(deviceCopy);
    return OwnersScope(*this);
  }
  // True while the running operation's buffers include device memory: the
  // algorithms then avoid any variant that copies blocks through host
  // scratch memory (select.cpp).
  bool deviceBuffers() const;
  // An algorithm's copy of a block within this rank (its own block of an
  // allgather, gather, scatter or all-to-all): memmove for host memory, the
  // adapter's device copy where either side is device memory. Overlapping
  // ranges are allowed only when identical (then nothing is copied).
  void copyLocal(void* dst, const void* src, size_t bytes);

  // What the algorithms keep between this group's operations.
  AlgorithmState& algorithmState() { return algorithmState_; }

  // What rank r's process is known by across groups (ProcessLinks::processKey).
  std::string processKeyOf(int r) const;
  // Each rank's nonce for this group (what its records and connections name).
  const std::vector<uint64_t>& nonces() const { return nonces_; }

 private:
  friend class group::GroupBuilder;
  Communicator(const Config& cfg, std::chrono::milliseconds timeout);

  // How often a long wait runs the slow checks (transports' peer checks).
  static constexpr auto kSlowCheckEvery = std::chrono::milliseconds(200);
  // A peer's death is acted on this long after it was noticed, so that data it
  // sent just before exiting (still in flight on another socket) is consumed
  // first and a wait that can complete does.
  static constexpr auto kPeerFailureGrace = std::chrono::milliseconds(300);
  // A request failed because its peer ended its side on purpose waits up to
  // this long for the lifeline's report of a root cause: a peer that tore its
  // group down because it saw a third rank die is often heard before the
  // lifeline (another thread) has read that death, and the error should name
  // the dead rank, not the echo.
  static constexpr auto kRootCauseWait = std::chrono::milliseconds(500);

  Transport* route(int peer) const;
  void startOperation();  // counts the operation; refuses it on a broken group
  bool fromParent_ = false;  // formed by deriveRoster, with no join
  std::string settingsToCompare_;  // formed from the parent: its settings as set, for the lifeline to compare
  bool settingsAgreed_ = false;  // the neighbours confirmed equal settings (groups formed from the parent)
  void slowChecks();
  void throwIfPeerFailed(const std::string& what);
  void onPeerFailure(const std::string& why);  // from the runtime thread (the lifeline)
  // A transport connected `peer` and needs no socket to see it leave if the
  // lifeline watches it (Transport::setPeerWatch): true once it does.
  bool watchPeer(int peer);
  void failGonePeers();  // the watched peers the lifeline reported gone
  bool arrivalsPending() const;  // connections in the mailbox, not yet taken
  [[noreturn]] void throwFailure(const std::string& msg, bool peerEnded = false);
  void transportsFailAll(const std::string& why);

  Config cfg_;
  Topology topo_;
  AlgorithmState algorithmState_;
  Roster roster_;                       // what subgroups derive theirs from
  std::vector<std::shared_ptr<VerbsDevice>> verbsRails_;  // the process's ports this rank drives (port_choice.hpp)
  int formationStoreOps_ = 0;
  std::chrono::milliseconds timeout_;
  // Where the process's front desk leaves this group's connections (closed
  // last: a connection arriving meanwhile is simply dropped).
  std::unique_ptr<MailboxLease> mailbox_;
  std::unique_ptr<NodeShm> nodeShm_;
  std::vector<std::string> hostNames_;  // per rank, for messages
  std::vector<TcpEndpoint> endpoints_;  // per rank: its process's listener (loopback on this host)
  std::vector<uint64_t> nonces_;        // per rank: what it published; the front desk's key for its connections
  // blockUntilActivity and the engine's idle wait (waitIdle). Declared
  // before the transports, so it outlives them: the runtime thread forwards
  // their completion events to it until their CQs are gone.
  Wakeup wakeup_;
  std::vector<std::unique_ptr<Transport>> transports_;
  // Network peers' connections, made on demand (null without network peers;
  // destroyed before the transports, see the member order below).
  std::unique_ptr<ConnectionManager> connections_;
  bool connectionsReady_ = false;  // a blocked wait woke: service the sockets now
  std::vector<Transport*> routes_;  // per peer; null for self
  std::vector<bool> viaShm_;        // per peer: served by shared memory (for the counters)
  Counters counters_;
  OpProgress progress_;  // before lifeline_: the runtime thread reads this until the lifeline detaches
  std::vector<Request*> anySource_;
  std::vector<pollfd> waitFds_;  // reused by blockUntilActivity
  int extraWaitFd_ = -1;          // WakeOnFd
  std::vector<pollfd> idleFds_;  // reused by waitIdle
  size_t idlePrepared_ = 0;      // transports prepared by announceIdle(true), not yet ended
  bool idleShort_ = false;       // one of them cannot announce everything: waitIdle looks every millisecond
  std::deque<Request> owned_;  // requests created by post(kind, ...); see there
  std::string broken_;
  std::atomic<bool> abortRequested_{false};
  std::mutex abortMu_;
  std::string abortReason_;
  // A peer's failure reported by the lifelines (under abortMu_).
  std::atomic<bool> peerFailed_{false};
  std::atomic<bool> peersGone_{false};  // the lifeline has watched peers to report (takeGone)
  std::string peerFailure_;
  std::function<void(const std::string&)> peerFailureHook_;  // under abortMu_
  Clock::time_point peerFailedAt_{};
  std::string opName() const { return opWhat_ ? opWhat_->describe() : opName_; }
  std::string opName_ = "operation";
  const Describable* opWhat_ = nullptr;  // overrides opName_ while set
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point lastSlowCheck_{};
  uint64_t collectiveSeq_ = 0;
  std::atomic<uint64_t>* collectiveTagWord_ = nullptr;  // in this rank's control page, in a group on one machine
  ScratchBuffers scratch_;
  std::vector<BufferOwner> taskOwners_;
  DeviceCopy deviceCopy_;  // set with taskOwners_ (useBufferOwners)
  void attachOwner(Request& r) const;
  // Helper threads and the count of jobs they finished, which a blocking wait
  // re-checks after announcing itself (helperEventsSeen_: the count its caller
  // last looked at), so a job ending just before the sleep is not slept through.
  std::atomic<uint64_t> helperEvents_{0};
  uint64_t helperEventsSeen_ = 0;
  std::vector<std::unique_ptr<HelperThread>> helpers_;
  // Last member: destroyed first, so its thread (which calls onPeerFailure)
  // stops before anything it touches goes away.
  std::unique_ptr<Lifeline> lifeline_;
};

}  // namespace roce::comm
