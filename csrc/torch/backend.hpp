// The c10d::Backend for "roce": checks arguments on the caller's thread (a bad
// call raises at once and leaves the group usable), stages tensors into host
// buffers (device tensors asynchronously, on the group's copy streams:
// device_staging.hpp), and queues a Task on the group's progress engine.
#pragma once
#include <cstdint>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "../common/config.hpp"
#include "../common/counters.hpp"
#include "../engine/engine.hpp"
#include "abort_hooks.hpp"
#include "call_reduction.hpp"
#include "coalesced_work.hpp"
#include "device_staging.hpp"
#include "device_memory.hpp"
#include "pinned_cache.hpp"
#include "trace_dump.hpp"
#include "work.hpp"

namespace roce::adapter {
using namespace roce::engine;

struct WindowShared;

// What submit() needs of a collective's options.
struct CallOptions {
  std::chrono::milliseconds timeout;
  bool asyncOp = true;  // false: the caller waits for the Work at once (async_op=False)
  int root = -1;        // rooted collectives' root, for the trace
  // For the trace, where the outputs do not show it (gather on non-roots).
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

// PyTorch passes async_op down in the options (asyncOp, added in 2025 by
// pytorch/pytorch#147820); with older headers every call counts as
// asynchronous.
template <class Opts>
CallOptions callOf(const Opts& o) {
  CallOptions c{o.timeout};
  if constexpr (requires { o.asyncOp; }) c.asyncOp = o.asyncOp;
  if constexpr (requires { o.rootRank; }) c.root = static_cast<int>(o.rootRank);
  return c;
}

// Whether a group joins its members when it is created, or waits for its
// first reconfigure (torch's enable_reconfigure=True).
enum class Formation : uint8_t { Join, AwaitReconfigure };

class RoceBackend : public c10d::Backend {
 public:
  // Collective over the group: connects every rank (see Communicator).
  // `nearPci`: sysfs path of the GPU this rank uses ("" if none), for the NIC choice.
  RoceBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
              std::chrono::milliseconds timeout, int globalRank, const std::string& nearPci = {},
              Formation formation = Formation::Join);
  // A subgroup of `parent` formed from its roster, with no join through the
  // store (docs/ARCHITECTURE.md, "Subgroups from the parent"): collective
  // over the parent's ranks `parentRanks` (Communicator).
  RoceBackend(const RoceBackend& parent, const c10::intrusive_ptr<c10d::Store>& store, int rank,
              const std::vector<int>& parentRanks, const std::string& groupName, std::chrono::milliseconds timeout);
  ~RoceBackend() override;
  // Whether subgroups of this group form from it (ROCE_PG_SUBGROUPS=parent).
  bool formsSubgroups() const { return cfg_.subgroups == SubgroupMode::Parent; }
#ifdef ROCE_TORCH_BACKEND_SPLIT
  // torch.distributed.split_group: the new group forms from this one's
  // roster with no join, like new_group's subgroups. `ranks` are
  // this group's ranks; a rank not among them gets no backend.
  bool supportsSplitting() const override { return formsSubgroups(); }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  // What split_group copies for the child (the timeout, the members).
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  // torch.distributed.shrink_group: the group without `exclude` (this
  // group's ranks), formed from this one's roster like split's, so the
  // excluded ranks may be dead or hung. SHRINK_ABORT first fails what this
  // group has in flight. Every remaining rank calls it, the excluded ones not.
  bool supportsShrinking() const override { return formsSubgroups(); }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& exclude, int flags,
                                           const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
#endif
#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // torch's fault-tolerance API (reconfigure.cpp): a new membership for this
  // group, named by the members' handles, formed through the group's store
  // under the uuid's keys. The process runtime, transports, pools and
  // registrations stay; the old membership's communicator is aborted first,
  // so its work in flight fails naming the reconfigure. Completed when it
  // returns; no other call on this group may run meanwhile.
  bool supportsReconfigure() const override { return true; }
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
#endif
#ifdef C10D_BACKEND_HAS_WINDOW
  // One-sided windows of CPU tensors (window.hpp): collective, in the same
  // order on every rank.
  bool supportsWindow() const override { return true; }
  c10::intrusive_ptr<c10d::Window> new_window(const std::optional<at::Tensor>& tensor) override;
#endif
  // Store operations this group's formation made.
  int formationStoreOps() const;
  // Each rank's nonce for this group and its process's key (tests of hostile peers).
  std::vector<uint64_t> groupNonces() const;
  std::vector<std::string> processKeys() const;
  // The RDMA ports this rank drives ("rxe0:1, rxe1:1"; empty without verbs).
  std::string nics() const;

  const std::string getBackendName() const override { return "roce"; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  // torch >= 2.15 calls it (_add_ephemeral_timeout_for_all_pgs); not marked
  // override, so that it builds whether or not the installed torch declares it.
  void addEphemeralTimeout(const std::chrono::milliseconds& timeout);
  // Coalescing (batch_isend_irecv, _coalescing_manager): one Work for the
  // operations issued in between. Not marked override: it builds whether or
  // not the installed torch declares it.
  bool supportsCoalescing() const { return true; }
  void startCoalescing() override { coalescing_.start(getRank()); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override { return coalescing_.end(getRank()); }
  void shutdown() override;
  // Collectives issued so far (torch's debug wrapper compares it across ranks).
  uint64_t getSequenceNumberForGroup() override { return collectives_.load(); }
  void setSequenceNumberForGroup() override {}
  void abort() override;
#ifdef ROCE_TORCH_COMPLETION_HOOKS
  // torch's flight-recorder hook takes completions from here (completion_hooks.hpp).
  bool supportsCompletionHooks() const override { return true; }
  void registerCompletionHook(int64_t id, c10d::CompletionHook hook) override;
  void unregisterCompletionHook(int64_t id) override { completionHooks_.remove(id); }
  // Abort hooks and the time estimation calls arrived with the completion
  // hooks (abort_hooks.hpp). Time estimation (torch's _time_estimator):
  // between the two calls, calls from the thread that started it do not run;
  // each adds its estimate (collective_cost.hpp) and returns a completed Work
  // with its tensors untouched. Other threads' calls run as usual.
  bool supportsTimeEstimation() const override { return true; }
  void startTimeEstimate() override;
  float endTimeEstimate() override;  // microseconds
  bool supportsAbortHooks() const override { return true; }
  void registerAbortHook(int64_t id, c10d::AbortHook hook) override { abortHooks_.add(id, std::move(hook)); }
  void unregisterAbortHook(int64_t id) override { abortHooks_.remove(id); }
#endif
  // This group's flight recorder (roce_pg.trace()), and in torch's dump
  // layout (roce_pg.dump_trace(), trace_dump.hpp).
  const TraceRing& trace() const { return engine().trace(); }
  // Whether this group asks torch to leave it to roce's recorder (ROCE_PG_TORCH_FR).
  bool recordsNatively() const { return cfg_.recordsNatively(); }
  std::string placementSettings() const { return cfg_.placementSettings(); }
  std::string traceDumpJson() const;
  // The group's members' global ranks, for the dump (roce_pg's creator).
  void setTraceRanks(std::vector<int64_t> ranks) { traceRanks_ = std::move(ranks); }
  // Traffic counters of this group (roce_pg.counters()); any thread.
  Counters& counters();
  // Engine::waitParked (roce_pg._wait_engine_parked); any thread.
  bool waitEngineParked(std::chrono::milliseconds timeout);
  // The pinned staging buffers of device collectives (tests, benchmarks).
  PinnedCache::Stats deviceStagingStats() const { return pinned_->stats(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // Blocking, through the store (see monitored_barrier.hpp); does not wait for
  // this rank's earlier operations.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  void start(std::unique_ptr<Communicator> comm);  // the engine and the trace hooks
  // Host buffers for a call whose tensors are on like's device.
  CallStaging staging(const at::Tensor& like);
  // A device call's staging; refuses a call issued during a graph capture.
  std::shared_ptr<DeviceStaging> deviceStaging(const at::Tensor& like);
  // For the data-movement calls (broadcast, send/recv, allgather, gather,
  // scatter, all-to-all; peer -1: a collective): device tensors go to the
  // transport itself where gpudirect() says so - single contiguous ones as
  // they are, lists, non-contiguous tensors and views of storages larger than
  // ROCE_PG_IB_DEVICE_REG_BYTES through one device buffer of the call
  // (DeviceStaging::deviceBuffer); the algorithms copy their own block on the
  // device (Communicator::copyLocal). `largest` is the largest buffer the call
  // moves as every rank computes it (the whole list, n x the block), so the
  // ranks of a collective choose alike whatever their tensors' layout.
  CallStaging staging(const at::Tensor& like, int peer, size_t largest);
  // GPUDirect RDMA for a call on t's device with `peer` (-1: all)? Decided
  // before the call is issued from what is alike on every rank:
  // ROCE_PG_GPUDIRECT, the device type's registration path
  // (device_memory.hpp), every peer served by verbs, `largest` within
  // ROCE_PG_IB_DEVICE_REG_BYTES.
  GpudirectChoice gpudirect(const at::Tensor& t, int peer, size_t largest);

 public:
  // The line logged (ROCE_PG_DEBUG=INFO) at the group's first choice, for tests.
  std::string gpudirectLog() const { return callPeers_->gpudirectLog; }

 private:
  // Elements per staged piece of device tensors (ROCE_PG_DEVICE_PIECE_BYTES).
  int64_t devicePieceElems(size_t elementSize) const;
  // Staged reductions on the device (ROCE_PG_DEVICE_REDUCE, device_reduce.hpp):
  // the piece body of an allreduce (root -1) or reduce of `flat`, or null
  // where the host reduces. Allocates the rows buffer in `st`.
  CollectiveTask::Body elementwiseOnDevice(CallStaging& st, const at::Tensor& flat, CallReduction red, int root);
  // Elements of each rank's block per staged piece of all_gather_into_tensor
  // and reduce_scatter_tensor (p blocks of m elements on one side): the
  // blocks' side moves about ROCE_PG_DEVICE_PIECE_BYTES per piece, and each
  // block's part at least the smaller of that and kMinRowPieceBytes (a piece
  // copies block by block). 0 (one piece) for CPU tensors, GPUDirect calls
  // and non-contiguous tensors.
  int64_t blockPieceElems(const CallStaging& st, const at::Tensor& blocks, const at::Tensor& block) const;
  // The piece body of a reduce-scatter of staged `in` (p blocks, laid out by
  // CallStaging::rows) into `out`, on the device or the host; first and count
  // in elements of `out`. pieceElems as blockPieceElems (0: one piece).
  CollectiveTask::Body reduceScatterBody(CallStaging& st, const at::Tensor& in, const at::Tensor& out, DataType t,
                                         CallReduction red, int64_t pieceElems = 0);
  // A collective that runs once on its staged buffers.
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, const char* title, std::vector<at::Tensor> futureValue,
                                        CallStaging st, std::function<void(Communicator&)> body, CallOptions call,
                                        size_t bytes);
  // An element-wise collective on `flat` (allreduce, broadcast, reduce):
  // device tensors run in pieces of ROCE_PG_DEVICE_PIECE_BYTES.
  c10::intrusive_ptr<c10d::Work> submitElementwise(c10d::OpType type, const char* title,
                                                   std::vector<at::Tensor> futureValue, CallStaging st,
                                                   const at::Tensor& flat, CollectiveTask::Body body, CallOptions call);
  // A collective whose body runs on pieces of [0, elems) (device tensors:
  // pieces of pieceElems, 0 for one piece; CPU tensors: once, all of it).
  c10::intrusive_ptr<c10d::Work> submitInPieces(c10d::OpType type, const char* title,
                                                std::vector<at::Tensor> futureValue, CallStaging st, size_t elems,
                                                int64_t pieceElems, CollectiveTask::Body body, CallOptions call,
                                                size_t bytes);
  // allreduce and allreduce_coalesced: the tensors reduced in place as one flat buffer.
  c10::intrusive_ptr<c10d::Work> allreduceInPlace(c10d::OpType type, const char* title, std::vector<at::Tensor>& tensors,
                                                  const c10d::ReduceOp& op, CallOptions call);
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* title, std::vector<at::Tensor> futureValue,
                                         CallStaging st, size_t elems, CollectiveTask::Body body, CallOptions call,
                                         size_t bytes);
  c10::intrusive_ptr<c10d::Work> pointToPoint(c10d::OpType type, const char* title, std::vector<at::Tensor>& tensors,
                                              int peer, int tag);
  std::chrono::milliseconds effective(std::chrono::milliseconds t) const;
  TraceDumpGroup dumpGroup() const;
  // With the process's network refusals, for a dump (the doctor's trace
  // view); errors name the group by dumpGroup() alone.
  TraceDumpGroup dumpGroupWithNetwork() const;
  // Writes the trace to ROCE_PG_TRACE_DUMP's prefix: on the group's first
  // failure (the engine's onFailure) or on ROCE_PG_TRACE_SIGNAL; `why` is for the log.
  void dumpTrace(const TraceRing& ring, const char* why);
  uint64_t traceSignalId_ = 0;  // TraceSignal registration (0: none)
  OpLabel label(const char* title, size_t bytes) { return {title, ++seq_, bytes}; }
  // An operation's trace entry with the fields every operation has.
  TraceEntry traceEntry(c10d::OpType type, const OpLabel& what, std::chrono::milliseconds timeout,
                        uint64_t collectiveSeq, uint64_t p2pSeq) const;
  // Records a collective about to be issued (the collectiveSeq-th); its
  // position in the trace (0: recording is off).
  uint64_t traceCollective(c10d::OpType type, const OpLabel& what, uint64_t collectiveSeq,
                           const std::vector<at::Tensor>& outputs, const CallOptions& call);

  Config cfg_;
  std::chrono::milliseconds timeout_;
  AbortHooks abortHooks_;  // run at the group's first breaking failure
  // A completed Work for a call issued while estimating; adds its estimate.
  c10::intrusive_ptr<c10d::Work> estimated(c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                                           size_t bytes);
  // Whether calls of this thread are to be estimated, not run.
  bool estimatingHere();
  std::atomic<bool> estimating_{false};
  std::mutex estimateMu_;
  std::thread::id estimatingThread_;  // the thread that started the estimate
  std::chrono::steady_clock::time_point estimateStart_;
  bool estimateWarned_ = false;
  double estimatedSeconds_ = 0;
  std::atomic<bool> stopping_{false};  // the program aborts or destroys the group: no abort hooks
  // abort() and shutdown() calls, counted under engineMu_: a reconfigure
  // ends the membership it formed when one came while it formed.
  uint64_t stopRequests_ = 0;
  // Set by abort() and shutdown(): a reconfigure's formation (which has no
  // engine to abort) ends its waits on it.
  std::atomic<bool> formingAborted_{false};
  CoalescingRegion coalescing_;  // the Works of an open coalescing region
  TimeoutExtensions timeoutExtensions_;  // added to the timeout of the operations issued after them
  c10::intrusive_ptr<c10d::Store> store_;     // the group's store, for monitoredBarrier
  uint64_t monitoredBarriers_ = 0;             // calls so far; the same count on every rank
  CompletionHooks completionHooks_;       // before engine_: completions fire them until it is gone
  DeviceLanes lanes_;                     // copy streams per device
  // What the calls learn once per membership (a reconfigure starts afresh).
  struct CallPeers {
    std::once_flag gpudirectLogged;  // the path device tensors take, logged once
    std::once_flag listed;           // peers: every other rank and its transport
    std::vector<CallPeer> peers;
    std::string gpudirectLog;
  };
  std::unique_ptr<CallPeers> callPeers_ = std::make_unique<CallPeers>();
  std::shared_ptr<PinnedCache> pinned_;   // staging buffers of device tensors
  std::unique_ptr<Engine> engine_;        // after the two above: its tasks use them
  // The engine of the current membership; throws while there is none (a
  // group awaiting its first reconfigure, or one whose reconfigure failed).
  Engine& engine() const;
  // Its communicator; throws, naming why, once the group was aborted or
  // shut down (its engine stays, for the trace, but owns no communicator).
  Communicator& comm() const;
  std::string noMembersWhy_;  // why engine_ is null, for that error
  // Reconfigure (reconfigure.cpp): this process's handle, and the uuids it used.
  int globalRank_;
  uint64_t handleNonce_;
  std::vector<int64_t> usedUuids_;
  // Guards swapping engine_ against abort() and shutdown() from other threads
  // (and a subgroup's copy of what it takes from this parent).
  mutable std::mutex engineMu_;
  // The engine a thread holding engineMu_ is stopping (which joins its
  // progress thread): that progress thread, in an abort hook or a callback
  // that calls abort() or shutdown(), must not wait for the lock.
  std::atomic<Engine*> stoppingEngine_{nullptr};
  // engineMu_, to stop or replace the engine; unowned when called on the
  // progress thread of the engine another thread is stopping (it joins
  // this very thread: the caller hurries it, Engine::requestStop, instead).
  std::unique_lock<std::mutex> lockToStop();
  // Marks the engine that the thread holding engineMu_ stops, while it does.
  struct StoppingEngine {
    StoppingEngine(std::atomic<Engine*>& slot, Engine* e) : slot_(slot) { slot_.store(e); }
    ~StoppingEngine() { slot_.store(nullptr); }
    std::atomic<Engine*>& slot_;
  };
  // What a membership names alike on every member: its uuid (-1: the one the
  // group was created with), and the store keys of its monitored barriers.
  int64_t membershipUuid_ = -1;
  c10::intrusive_ptr<c10d::Store> membershipStore_;
  std::atomic<uint64_t> seq_{0};          // every operation, for messages
  std::atomic<uint64_t> collectives_{0};  // collectives only
  std::atomic<uint64_t> p2ps_{0};         // point-to-point operations only
  // A group derived from this one: `ranks` (this group's) with the name
  // every member gives it; its trace names the world's ranks.
  c10::intrusive_ptr<RoceBackend> derived(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const std::string& name, std::chrono::milliseconds timeout);
  std::atomic<uint64_t> shrinks_{0};  // names each shrink's group alike on every member
  std::vector<int64_t> traceRanks_;       // set once, before any operation
  // One-sided windows (window.hpp): counted alike on every rank (both are
  // collective); the live registrations learn when the group can no longer
  // serve them (failWindows: its failure, abort, shutdown, reconfigure).
  std::atomic<uint64_t> windows_{0};
  std::atomic<uint64_t> windowRegistrations_{0};
  std::mutex windowsMu_;
  std::vector<std::weak_ptr<WindowShared>> windowStates_;
  // Under windowsMu_: why the membership can no longer serve windows, once it
  // cannot. A window whose registration completes after that (a peer died
  // while the others finished registering) fails at once, instead of
  // waiting for a report that came before it was listed.
  std::string windowsFailure_;
  void failWindows(const std::string& why);
  friend class RoceWindow;  // its collectives, engine and timeout are the group's
};

}  // namespace roce::adapter
