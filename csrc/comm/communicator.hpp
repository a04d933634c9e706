// What the collective algorithms see of the network: a rank, a size, a
// topology, and point-to-point Requests that it routes to whichever transport
// serves each peer (shared memory on the same machine, TCP elsewhere). It also
// owns the single wait loop, so timeouts, peer failures and cross-rank abort
// notices behave the same in every algorithm.
//
// Used only from the group's progress thread (construction excepted).
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../common/backoff.hpp"
#include "../common/bootstrap.hpp"
#include "../common/config.hpp"
#include "../transport/transport.hpp"
#include "topology.hpp"

namespace roce {

class NodeShm;
class TcpListener;

class Communicator {
 public:
  // Collective over the group: exchanges rank info through `bs`, connects
  // transports. `globalRank` places the rank on simulated nodes.
  Communicator(std::unique_ptr<Bootstrap> bs, const Config& cfg, int rank, int size, int globalRank,
               std::chrono::milliseconds timeout);
  ~Communicator();

  int rank() const { return topo_.rank; }
  int size() const { return topo_.size; }
  const Topology& topology() const { return topo_; }
  const Config& config() const { return cfg_; }
  // Non-null when every rank of the group shares this machine's memory.
  NodeShm* nodeShm() const { return topo_.allLocal() ? nodeShm_.get() : nullptr; }
  const char* transportName(int peer) const;

  // --- per-operation context -------------------------------------------------
  // Names the running operation in error messages and sets its deadline.
  void beginOperation(const std::string& what, Clock::time_point deadline);
  uint64_t nextCollectiveTag() { return ++collectiveSeq_; }
  static uint64_t p2pTag(int userTag) { return (1ull << 63) | static_cast<uint32_t>(userTag); }

  // --- point to point --------------------------------------------------------
  void post(Request& r);
  void postRecvAnySource(Request& r);  // r.peer is set once a sender is chosen
  bool progress();
  // Blocks until all requests are done; throws on the first failure, on the
  // deadline, on abort, or when another rank reported a failure.
  void waitAll(Request* const* reqs, size_t n);
  void wait(Request& r) { Request* p = &r; waitAll(&p, 1); }
  // Generic form: `done` is polled; `waitingFor` names what is missing for errors.
  void waitUntil(const std::function<bool()>& done, const std::function<std::string()>& waitingFor);

  // Checks that need no peers: deadline and abort flag (for async point-to-point).
  void checkDeadline(const std::function<std::string()>& waitingFor);

  // --- failure handling ------------------------------------------------------
  // After a failure mid-operation the peers' message streams can no longer be
  // trusted: fail everything pending, refuse further work, and tell the other
  // ranks through the store so they stop waiting instead of timing out.
  // tellPeers=false for local shutdown/abort, which is not the peers' failure.
  void breakWith(const std::string& reason, bool tellPeers = true);
  const std::string& brokenReason() const { return broken_; }
  void requestAbort(const std::string& why);  // thread-safe
  // Called periodically during long waits (lets the engine finish async work).
  std::function<void()> idleHook;

  // Scratch memory reused across operations (index selects an independent buffer).
  void* scratch(size_t bytes, int index = 0);

  // Shared-memory allreduce bookkeeping (barrier generation, slot parity).
  uint64_t shmBarrierGeneration = 0;
  uint64_t shmIteration = 0;

 private:
  Transport* route(int peer) const;
  // "verbs" or "tcp" for the peers not on this machine; throws when the group
  // needs the network, verbs was not ruled out, and some rank lacks a port.
  std::string chooseNetworkTransport(const std::vector<RankInfo>& infos) const;
  void slowChecks();
  [[noreturn]] void throwFailure(const std::string& msg);
  void transportsFailAll(const std::string& why);

  Config cfg_;
  std::unique_ptr<Bootstrap> bs_;
  Topology topo_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpListener> listener_;
  std::unique_ptr<NodeShm> nodeShm_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<Transport*> routes_;  // per peer; null for self
  std::vector<Request*> anySource_;
  std::string broken_;
  std::atomic<bool> abortRequested_{false};
  std::mutex abortMu_;
  std::string abortReason_;
  std::string opName_ = "operation";
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point lastSlowCheck_{};
  uint64_t collectiveSeq_ = 0;
  struct FreeDeleter { void operator()(void* p) const; };
  std::vector<std::unique_ptr<char, FreeDeleter>> scratch_;
  std::vector<size_t> scratchBytes_;
};

}  // namespace roce
