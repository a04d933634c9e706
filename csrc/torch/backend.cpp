#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "backend.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <cstdint>
#include <numeric>
#include <string_view>
#include <thread>

#include "../algorithms/algorithms.hpp"
#include "../algorithms/collective_cost.hpp"
#include "../algorithms/select.hpp"
#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "../common/log.hpp"
#include "../common/random.hpp"
#include "../group/group_builder.hpp"
#include "device_capture.hpp"
#include "device_reduce.hpp"
#include "job_secret_store.hpp"
#include "monitored_barrier.hpp"
#include "sparse_allreduce.hpp"
#include "store_bootstrap.hpp"
#include "trace_signal.hpp"

namespace roce::adapter {
using namespace roce::algorithms;
using namespace roce::comm;
using namespace roce::group;

namespace {

using c10d::OpType;

// OpType values newer than torch 2.11 (the GPU machines' torch), which has
// only the generic COALESCED for these calls: fn<OpType>(0) is OpType::NAME
// where it exists.
#define ROCE_NEWER_OPTYPE(fn, NAME)                                                   \
  template <class E>                                                                  \
  constexpr auto fn(int) -> decltype(E::NAME) {                                       \
    return E::NAME;                                                                   \
  }                                                                                   \
  template <class E>                                                                  \
  constexpr E fn(long) {                                                              \
    return E::COALESCED;                                                              \
  }
ROCE_NEWER_OPTYPE(allgatherIntoTensorCoalesced, ALLGATHER_INTO_TENSOR_COALESCED)
ROCE_NEWER_OPTYPE(reduceScatterTensorCoalesced, REDUCE_SCATTER_TENSOR_COALESCED)
#undef ROCE_NEWER_OPTYPE

bool onCpu(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts)
    if (t.defined() && !t.device().is_cpu()) return false;
  return true;
}

size_t bytesOf(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

// Host buffers for the tensor pairs of a coalesced call (inputs[i] ->
// outputs[i]), appended to ins and outs; returns the input bytes.
size_t stagePairs(CallStaging& st, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                  std::vector<at::Tensor>& ins, std::vector<at::Tensor>& outs) {
  size_t bytes = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ins.push_back(st.input(inputs[i]));
    outs.push_back(st.output(outputs[i]));
    bytes += bytesOf(ins.back());
  }
  return bytes;
}

// Element `first` of a host buffer (element-wise bodies work on a piece).
void* elementAt(const at::Tensor& t, size_t first) {
  return static_cast<char*>(t.data_ptr()) + first * t.element_size();
}

void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, size_t expected, const char* op,
               const char* what) {
  TORCH_CHECK(list.size() == expected, "roce: ", op, ": expected ", expected, " ", what, " tensors (one per rank), got ",
              list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    checkSameDeviceAndDtype(list[i], like, op);
    TORCH_CHECK(list[i].numel() == like.numel(), "roce: ", op, ": ", what, " tensor ", i, " has ", list[i].numel(),
                " elements but the ", what == std::string("output") ? "input" : "output", " has ", like.numel());
  }
}

}  // namespace

RoceBackend::RoceBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout, int globalRank, const std::string& nearPci,
                         Formation formation)
    : c10d::Backend(rank, size), timeout_(timeout), store_(store), globalRank_(globalRank),
      handleNonce_(randomNonce()), membershipStore_(store) {
  try {
    cfg_ = Config::fromEnv();
    cfg_.verbs.nearDevicePci = nearPci;
    ensureJobSecret(store);
    if (formation == Formation::AwaitReconfigure) {
      noMembersWhy_ = "it was created with enable_reconfigure=True and has no members until its first "
                      "reconfigure (dist._reconfigure with the members' handles)";
      pinned_ = std::make_shared<PinnedCache>(cfg_.device.stagingCacheBytes);
      return;
    }
    StoreBootstrap bs(store);
    start(GroupBuilder::join(bs, cfg_, rank, size, globalRank, timeout));
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
}

RoceBackend::RoceBackend(const RoceBackend& parent, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                         const std::vector<int>& parentRanks, const std::string& groupName,
                         std::chrono::milliseconds timeout)
    : c10d::Backend(rank, static_cast<int>(parentRanks.size())), timeout_(timeout), store_(store),
      globalRank_(parent.globalRank_), handleNonce_(randomNonce()), membershipStore_(store) {
  try {
    // The parent's lock is taken below: on a progress thread, another thread
    // stopping the parent may hold it while it joins this very thread.
    if (Engine::onProgressThread())
      throwInvalid(str("subgroup ", groupName, " was created on a roce progress thread (a Work's callback or an "
                       "abort hook): create groups from the program's own thread"));
    cfg_ = Config::fromEnv();
    StoreBootstrap bs(store);
    GroupBuilder::ParentView view;
    {
      // Copied under the parent's lock, formed after it: an abort() of the
      // parent from another thread (a watchdog) may free its communicator
      // meanwhile, and must not wait for this formation.
      std::lock_guard<std::mutex> g(parent.engineMu_);
      if (!parent.engine_)
        throwInvalid(str("cannot form subgroup ", groupName, " from its parent group: the parent has no members (",
                         parent.noMembersWhy_, ")"));
      if (!parent.engine_->hasComm())
        throwInvalid(str("cannot form subgroup ", groupName, " from its parent group: the parent was shut down or "
                         "aborted. Create subgroups and shrink while the parent lives (shrink_group with "
                         "SHRINK_ABORT aborts the parent once the shrunk group formed); for new_group/split_group, "
                         "ROCE_PG_SUBGROUPS=join forms them without the parent"));
      view = GroupBuilder::parentView(parent.engine_->comm());
    }
    start(GroupBuilder::derive(view, bs, cfg_, rank, parentRanks, groupName, timeout));
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
}

#ifdef ROCE_TORCH_BACKEND_SPLIT
c10::intrusive_ptr<c10d::Backend::Options> RoceBackend::getBackendOptions() {
  auto o = c10::make_intrusive<c10d::Backend::Options>("roce", timeout_);
  for (int64_t r : traceRanks_) o->global_ranks_in_group.push_back(static_cast<uint64_t>(r));
  return o;
}

c10::intrusive_ptr<c10d::Backend> RoceBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks,
                                                     const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  if (std::find(ranks.begin(), ranks.end(), getRank()) == ranks.end())
    return nullptr;  // not a member: torch makes it a non-member
  const std::chrono::milliseconds timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_;
  const std::string name = opts ? opts->group_name : std::string();
  TORCH_CHECK(!name.empty(), "roce: split_group needs the new group's name (torch passes it in the options)");
  return derived(store, ranks, name, timeout);
}

c10::intrusive_ptr<c10d::Backend> RoceBackend::shrink(const std::vector<int64_t>& exclude, int flags,
                                                      const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  TORCH_CHECK(formsSubgroups(), "roce: shrink_group needs ROCE_PG_SUBGROUPS=parent (the default) on the world group");
  std::vector<int> ranks;
  std::string excluded;
  for (int r = 0; r < getSize(); ++r) {
    if (std::find(exclude.begin(), exclude.end(), r) != exclude.end()) {
      excluded += str(excluded.empty() ? "" : ",", r);
      continue;
    }
    ranks.push_back(r);
  }
  TORCH_CHECK(std::find(ranks.begin(), ranks.end(), getRank()) != ranks.end(), "roce: rank ", getRank(),
              " is excluded from the shrunk group and must not call shrink_group");
  TORCH_CHECK(!ranks.empty() && excluded.size() > 0, "roce: shrink_group must exclude some ranks and keep some");
  const std::chrono::milliseconds timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_;
  // The same on every member: they shrink this group the same number of times.
  const std::string name = str(getGroupUid(), membershipUuid_ >= 0 ? str("/membership", membershipUuid_) : "",
                               "/shrunk", ++shrinks_, "-without-", excluded);
  // Formed before any abort: a subgroup forms from a living parent's roster.
  // The parent's in-flight work does not hold it up (formation runs on this
  // thread, over the process's links, not on the parent's progress thread).
  // With torch's SHRINK_ABORT the parent's work in flight is aborted after,
  // also when the shrunk group could not form (the program asked for it).
  auto abortParent = [&] {
    if (!(flags & 0x01)) return;
    stopping_ = true;
    std::lock_guard<std::mutex> g(engineMu_);
    const StoppingEngine mark(stoppingEngine_, engine_.get());
    if (engine_) engine_->abort(str("shrink_group(SHRINK_ABORT) excluding ranks ", excluded, " was called on this group"));
  };
  c10::intrusive_ptr<RoceBackend> child;
  try {
    child = derived(store_, ranks, name, timeout);
  } catch (...) {
    abortParent();
    throw;
  }
  abortParent();
  return child;
}

c10::intrusive_ptr<RoceBackend> RoceBackend::derived(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks, const std::string& name,
                                                     std::chrono::milliseconds timeout) {
  const int rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), getRank()) - ranks.begin());
  auto child = c10::make_intrusive<RoceBackend>(*this, store, rank, ranks, name, timeout);
  std::vector<int64_t> global;
  for (int r : ranks) global.push_back(r < static_cast<int>(traceRanks_.size()) ? traceRanks_[r] : r);
  child->setTraceRanks(std::move(global));
  return child;
}
#endif

int RoceBackend::formationStoreOps() const { return comm().formationStoreOps(); }

std::vector<uint64_t> RoceBackend::groupNonces() const { return comm().nonces(); }

std::vector<std::string> RoceBackend::processKeys() const {
  std::vector<std::string> keys;
  for (int r = 0; r < getSize(); ++r) keys.push_back(comm().processKeyOf(r));
  return keys;
}
std::string RoceBackend::nics() const { return comm().nicsText(); }

void RoceBackend::start(std::unique_ptr<Communicator> comm) {
  if (!pinned_) pinned_ = std::make_shared<PinnedCache>(cfg_.device.stagingCacheBytes);
  engine_ = std::make_unique<Engine>(std::move(comm));
  {
    std::lock_guard<std::mutex> g(windowsMu_);
    windowsFailure_.clear();  // a new membership serves windows again
  }
  // A parked group learns of a peer's failure only from the lifelines:
  // windows' waits must not sleep through it.
  engine_->comm().setPeerFailureHook([this](const std::string& why) { failWindows(why); });
  engine_->onFailure = [this](const TraceRing& ring) {
    failWindows(str("rank ", getRank(), "'s group failed (its failed operation's error says why)"));
    if (!cfg_.trace.dump.empty()) dumpTrace(ring, "its first failure");
    if (!stopping_.load()) abortHooks_.run(str("rank ", getRank()));
  };
  if (cfg_.trace.signal && !traceSignalId_)
    traceSignalId_ = TraceSignal::add(cfg_.trace.signal, [this] {
      if (engine_) dumpTrace(engine_->trace(), "a signal");
    });
}

Engine& RoceBackend::engine() const {
  if (!engine_) C10_THROW_ERROR(DistBackendError, str("roce: rank ", getRank(), ": group ", dumpGroup().name,
                                                      " has no members: ", noMembersWhy_));
  return *engine_;
}

Communicator& RoceBackend::comm() const {
  Engine& e = engine();
  if (!e.hasComm())
    C10_THROW_ERROR(DistBackendError, str("roce: rank ", getRank(), ": group ", dumpGroup().name,
                                          " no longer runs (", e.stopReason(), "): create a new group, or reconfigure "
                                          "this one if it was made with enable_reconfigure=True"));
  return e.comm();
}

RoceBackend::~RoceBackend() {
  stopping_ = true;
  failWindows("the process group was destroyed");
  if (traceSignalId_) TraceSignal::remove(traceSignalId_);  // no dump of this group runs after this
  engine_.reset();
}

std::unique_lock<std::mutex> RoceBackend::lockToStop() {
  std::unique_lock<std::mutex> g(engineMu_, std::defer_lock);
  Engine* mine = Engine::ofThisThread();
  if (!mine) {
    g.lock();
    return g;
  }
  while (!g.try_lock()) {
    if (stoppingEngine_.load() == mine) return g;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return g;
}

void RoceBackend::shutdown() {
  stopping_ = true;
  failWindows("the process group was shut down");
  auto g = lockToStop();
  if (!g.owns_lock()) return;  // another thread stops this engine, and waits for this thread
  const StoppingEngine mark(stoppingEngine_, engine_.get());
  ++stopRequests_;
  formingAborted_ = true;
  if (engine_) engine_->shutdown(std::chrono::milliseconds(cfg_.shutdownGraceMs));
}

Counters& RoceBackend::counters() { return comm().counters(); }

bool RoceBackend::waitEngineParked(std::chrono::milliseconds timeout) { return engine().waitParked(timeout); }

void RoceBackend::abort() {
  stopping_ = true;
  failWindows("abort() was called on this process group");
  auto g = lockToStop();
  if (!g.owns_lock()) {
    // Another thread stops this engine (a shutdown's grace, a reconfigure)
    // and waits for this thread: the abort hurries it.
    Engine::ofThisThread()->requestStop("abort() was called on this process group");
    return;
  }
  const StoppingEngine mark(stoppingEngine_, engine_.get());
  ++stopRequests_;
  formingAborted_ = true;
  if (engine_) engine_->abort("abort() was called on this process group");
}

void RoceBackend::addEphemeralTimeout(const std::chrono::milliseconds& timeout) {
  TORCH_CHECK(timeout.count() >= 0, "roce: an ephemeral timeout extension must not be negative, got ", timeout.count(),
              " ms");
  timeoutExtensions_.add(timeout);
}

std::chrono::milliseconds RoceBackend::effective(std::chrono::milliseconds t) const {
  return t.count() < 0 ? timeout_ : t;
}

TraceDumpGroup RoceBackend::dumpGroup() const {
  TraceDumpGroup g;
  // The group's name and description are set by torch after creation;
  // torch 2.11's Backend may lack the accessors.
  if constexpr (requires(const c10d::Backend& b) { b.getGroupUid(); }) g.name = getGroupUid();
  if constexpr (requires(const c10d::Backend& b) { b.getGroupDesc(); }) g.desc = getGroupDesc();
  if (g.name.empty()) g.name = "roce";
  g.ranks = traceRanks_;
  g.rank = getRank();
  return g;
}

TraceDumpGroup RoceBackend::dumpGroupWithNetwork() const {
  TraceDumpGroup g = dumpGroup();
  g.network = networkRefusals();
  return g;
}

std::string RoceBackend::traceDumpJson() const {
  return roce::adapter::traceDumpJson(engine().trace(), dumpGroupWithNetwork());
}

void RoceBackend::dumpTrace(const TraceRing& ring, const char* why) {
  const TraceDumpGroup g = dumpGroupWithNetwork();
  const int global = getRank() < static_cast<int>(g.ranks.size()) ? static_cast<int>(g.ranks[getRank()]) : getRank();
  const std::string prefix = cfg_.trace.dump.empty() ? std::string("/tmp/roce_trace_") : cfg_.trace.dump;
  const std::string path = str(prefix, global, "_", g.name, ".json");
  std::string error;
  if (writeTraceDump(path, ring, g, &error))
    ROCE_WARN("roce: wrote the trace of group ", g.name, " to ", path, " (on ", why, ")");
  else ROCE_WARN("roce: could not dump the trace of group ", g.name, " (ROCE_PG_TRACE_DUMP): ", error);
}

#ifdef ROCE_TORCH_COMPLETION_HOOKS
void RoceBackend::registerCompletionHook(int64_t id, c10d::CompletionHook hook) {
  completionHooks_.add(id, [hook = std::move(hook)](uint64_t key, std::optional<float> durationMs) {
    c10d::CompletionHookArgs args;
    args.completionKey = key;
    args.duration_ms = durationMs;
    hook(args);
  });
}
#endif

TraceEntry RoceBackend::traceEntry(OpType type, const OpLabel& what, std::chrono::milliseconds timeout,
                                   uint64_t collectiveSeq, uint64_t p2pSeq) const {
  TraceEntry e;
  e.seq = what.seq;
  e.collectiveSeq = collectiveSeq;
  e.p2pSeq = p2pSeq;
  e.op = what.title;
  e.opType = static_cast<uint8_t>(type);
  e.bytes = what.bytes;
  e.timeoutMs = timeout.count();
  return e;
}

uint64_t RoceBackend::traceCollective(OpType type, const OpLabel& what, uint64_t collectiveSeq,
                                      const std::vector<at::Tensor>& outputs, const CallOptions& call) {
  TraceRing& ring = engine().trace();
  if (!ring.enabled()) return 0;
  TraceEntry e =
      traceEntry(type, what, effective(call.timeout), collectiveSeq, p2ps_.load(std::memory_order_relaxed));
  e.peer = call.root;
  c10::ScalarType dtype = call.dtype;
  for (const auto& t : outputs) {
    if (!t.defined()) continue;
    e.outElems += t.numel();
    if (dtype == c10::ScalarType::Undefined) dtype = t.scalar_type();
  }
  if (!outputs.empty()) e.outDtype = static_cast<int16_t>(dtype);
  if (dtype != c10::ScalarType::Undefined) {
    // Every collective's inputs have its outputs' type; `bytes` is the input
    // the algorithms see per rank.
    e.inDtype = static_cast<int16_t>(dtype);
    e.inElems = what.bytes / c10::elementSize(dtype);
  }
  return ring.record(e);
}

int64_t RoceBackend::devicePieceElems(size_t elementSize) const {
  return std::max<int64_t>(1, cfg_.device.pieceBytes / elementSize);
}

CollectiveTask::Body RoceBackend::elementwiseOnDevice(CallStaging& st, const at::Tensor& flat, CallReduction red,
                                                      int root) {
  if (!st.device) return nullptr;
  // The largest piece decides for all (every rank cuts the same pieces).
  const int64_t piece = std::min<int64_t>(flat.numel(), devicePieceElems(flat.element_size()));
  if (piece == 0 || !reduceStagedOnDevice(comm(), piece * flat.element_size())) return nullptr;
  const int p = getSize();
  const at::Tensor rows = st.device->hostBuffer(p * ((piece + p - 1) / p), flat.scalar_type());
  const c10::Stream stream = st.device->reduceStream();
  prepareDeviceReduction(stream, flat.scalar_type(), red.op(), p, getRank(), flat.numel(), piece);
  return [flat, rows, stream, red, root](Communicator& c, size_t first, size_t count) {
    reduceReducingOnDevice(c, stream, flat.narrow(0, first, count), rows, red.get(), root);
  };
}

int64_t RoceBackend::blockPieceElems(const CallStaging& st, const at::Tensor& blocks, const at::Tensor& block) const {
  if (!st.device || st.direct || !blocks.is_contiguous() || !block.is_contiguous()) return 0;
  // A piece copies each block's part on its own (a copy per rank and
  // direction, no kernel): below a few hundred KiB per copy, launching them
  // would cost more than moving the bytes.
  constexpr int64_t kMinRowPieceBytes = 256 << 10;
  const int64_t pieceBytes = static_cast<int64_t>(cfg_.device.pieceBytes);
  const int64_t rowBytes = std::max(pieceBytes / getSize(), std::min(pieceBytes, kMinRowPieceBytes));
  return std::max<int64_t>(1, rowBytes / static_cast<int64_t>(block.element_size()));
}

CollectiveTask::Body RoceBackend::reduceScatterBody(CallStaging& st, const at::Tensor& in, const at::Tensor& out,
                                                    DataType t, CallReduction red, int64_t pieceElems) {
  const int64_t p = getSize(), m = out.numel();
  const int64_t piece = pieceElems > 0 ? std::min(pieceElems, m) : m;
  if (st.device && m > 0 && reduceStagedOnDevice(comm(), p * piece * in.element_size())) {
    const at::Tensor rows = st.device->hostBuffer(p * piece, in.scalar_type());
    const c10::Stream stream = st.device->reduceStream();
    for (int64_t count : {piece, m % piece})
      if (count > 0) prepareDeviceReduction(stream, in.scalar_type(), red.op(), p, getRank(), count, 0);
    return [in, rows, out, stream, red, p](Communicator& c, size_t first, size_t count) {
      const auto n = static_cast<int64_t>(count);
      reduceScatterReducingOnDevice(c, stream, in.narrow(0, p * first, p * n), rows.narrow(0, 0, p * n),
                                    out.narrow(0, first, n), red.get());
    };
  }
  return [in, out, t, red, p](Communicator& c, size_t first, size_t count) {
    roce::algorithms::reduceScatter(c, elementAt(in, p * first), elementAt(out, first), count, t, red.get());
  };
}

CallStaging RoceBackend::staging(const at::Tensor& like) {
  if (like.device().is_cpu()) return CallStaging();
  return CallStaging(deviceStaging(like));
}

std::shared_ptr<DeviceStaging> RoceBackend::deviceStaging(const at::Tensor& like) {
  refuseCapture(like.device(), getRank(), "a collective or point-to-point call was issued");
  return std::make_shared<DeviceStaging>(lanes_.of(like.device()), pinned_);
}

CallStaging RoceBackend::staging(const at::Tensor& like, int peer, size_t largest) {
  if (like.device().is_cpu()) return staging(like);
  const GpudirectChoice choice = gpudirect(like, peer, largest);
  if (choice.path == DeviceMemoryPath::Staged) return staging(like);
  CallStaging st(deviceStaging(like), /*direct=*/true);
  st.exportDmabuf = choice.exportDmabuf;  // null unless by dma-buf
  st.flushNicWrites = choice.flushNicWrites;
  st.bufferId = choice.bufferId;
  st.directLimit = cfg_.verbs.deviceRegBytes;
  return st;
}

GpudirectChoice RoceBackend::gpudirect(const at::Tensor& t, int peer, size_t largest) {
  Communicator& c = comm();
  // The ranks the call talks to and their transports: one for send/recv; every
  // other rank for a collective, listed once per group (routes are fixed at
  // setup), so a call does not walk the group.
  CallPeers& known = *callPeers_;
  std::call_once(known.listed, [&] {
    for (int p = 0; p < c.size(); ++p)
      if (p != c.rank()) known.peers.emplace_back(p, c.transportName(p));
  });
  const std::vector<CallPeer> one = peer >= 0 ? std::vector<CallPeer>{{peer, c.transportName(peer)}}
                                              : std::vector<CallPeer>{};
  const std::vector<CallPeer>& peers = peer >= 0 ? one : known.peers;
  std::string nicWhy = "no peer";
  const bool nicDmabuf = !peers.empty() && c.registersDmabuf(peers.back().first, &nicWhy);
  // A collective's ranks must choose alike, and a rank sees only its own
  // peers: where a machine holds several of the group's ranks (and
  // ROCE_PG_FORCE_NETWORK, the roster's, is off), those have a shared-memory
  // peer, so every rank of a collective stages. The topology is everyone's.
  const bool sharedMachine = peer < 0 && !c.config().placement.forceNetwork && c.topology().numNodes != c.size();
  GpudirectChoice choice = chooseGpudirect(cfg_.device.gpudirect, deviceMemoryPath(t.device()), nicDmabuf, nicWhy, peers,
                                           sharedMachine, largest, cfg_.verbs.deviceRegBytes);
  std::call_once(known.gpudirectLogged, [&] {
    known.gpudirectLog = str("rank ", c.rank(), ": ", t.device().str(), " tensors of data-movement calls go ",
                        choice.path == DeviceMemoryPath::Staged ? "through host staging" : "to the NIC directly, by ",
                        choice.path == DeviceMemoryPath::Staged ? "" : pathName(choice.path), " (", choice.why, ")");
    ROCE_INFO(known.gpudirectLog);
  });
  return choice;
}

c10::intrusive_ptr<c10d::Work> RoceBackend::submit(OpType type, const char* title, std::vector<at::Tensor> futureValue,
                                                   CallStaging st, std::function<void(Communicator&)> body,
                                                   CallOptions call, size_t bytes) {
  return submitInPieces(type, title, std::move(futureValue), std::move(st), /*elems=*/0, /*pieceElems=*/0,
                        [body = std::move(body)](Communicator& c, size_t, size_t) { body(c); }, call, bytes);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::submitElementwise(OpType type, const char* title,
                                                              std::vector<at::Tensor> futureValue, CallStaging st,
                                                              const at::Tensor& flat, CollectiveTask::Body body,
                                                              CallOptions call) {
  const size_t n = flat.numel(), elementSize = flat.element_size();
  return submitInPieces(type, title, std::move(futureValue), std::move(st), n, devicePieceElems(elementSize),
                        std::move(body), call, n * elementSize);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::submitInPieces(OpType type, const char* title,
                                                           std::vector<at::Tensor> futureValue, CallStaging st,
                                                           size_t elems, int64_t pieceElems, CollectiveTask::Body body,
                                                           CallOptions call, size_t bytes) {
  if (st.device) st.device->start(pieceElems, static_cast<int64_t>(elems));
  return enqueue(type, title, std::move(futureValue), std::move(st), elems, std::move(body), call, bytes);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::enqueue(OpType type, const char* title, std::vector<at::Tensor> futureValue,
                                                    CallStaging st, size_t elems, CollectiveTask::Body body,
                                                    CallOptions call, size_t bytes) {
  if (estimatingHere()) return estimated(type, title, std::move(futureValue), bytes);
  comm();  // a group that was aborted or shut down refuses here, before counting or tracing the call
  const uint64_t collectiveSeq = ++collectives_;
  // Small CPU collectives skip the progress thread when it is idle: no
  // hand-off, and the Work is returned already completed. Always for a
  // synchronous call (async_op=False: the caller waits at once, without a
  // timeout); for an asynchronous one only when ROCE_PG_INLINE_MAX_BYTES asks,
  // since the call then blocks until its peers arrive.
  const size_t inlineMax = call.asyncOp ? cfg_.inlineMaxBytes : std::max(cfg_.inlineMaxBytes, cfg_.syncInlineMaxBytes);
  // Never device tensors: their copies are asynchronous, the progress thread
  // waits for them.
  const bool inlinable = inlineMax > 0 && bytes <= inlineMax && !st.device && onCpu(futureValue);
  const OpLabel what = label(title, bytes);
  const uint64_t tracePos = traceCollective(type, what, collectiveSeq, futureValue, call);
  auto work = c10::make_intrusive<RoceWork>(type, getRank(), title, std::move(futureValue));
  work->identify(what.seq, &completionHooks_);
  auto task = std::make_shared<CollectiveTask>(work, what, std::move(st), elems, std::move(body));
  task->timeout = effective(call.timeout) + timeoutExtensions_.issue(task->timeoutExtension);
  task->tracePos = tracePos;
  task->collectiveSeq = collectiveSeq;
  task->collectiveOp = title;
  comm().opProgress().issued(collectiveSeq, title);
  coalescing_.issued(work);
  if (inlinable && engine().runInline(*task)) {
    Counters::add(counters().inlineOps, 1);
    return work;
  }
  engine().enqueue(std::move(task));
  return work;
}

c10::intrusive_ptr<c10d::Work> RoceBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  checkSingle(tensors, "broadcast");
  checkRank(opts.rootRank, getSize(), "root", "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  CallStaging st = staging(tensors[0], /*peer=*/-1, tensors[0].nbytes());
  const at::Tensor h = st.inPlace(tensors, /*read=*/getRank() == root, /*write=*/getRank() != root);
  return submitElementwise(OpType::BROADCAST, "broadcast", tensors, std::move(st), h,
                           [h, root](Communicator& c, size_t first, size_t count) {
                             roce::algorithms::broadcast(c, elementAt(h, first), count * h.element_size(), root);
                           },
                           callOf(opts));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  // torch's dispatcher sends all_reduce of a sparse CPU tensor here, not to
  // allreduce_sparse (Gloo reduces sparse tensors in allreduce too).
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) return allreduce_sparse(tensors, opts);
  checkSingle(tensors, "allreduce");
  return allreduceInPlace(OpType::ALLREDUCE, "allreduce", tensors, opts.reduceOp, callOf(opts));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::allreduceInPlace(OpType type, const char* title,
                                                             std::vector<at::Tensor>& tensors,
                                                             const c10d::ReduceOp& op, CallOptions call) {
  const DataType t = reductionType(tensors[0], title);
  CallStaging st = staging(tensors[0]);
  const CallReduction red(op, t, st);
  const at::Tensor flat = st.inPlace(tensors, true, true);
  if (auto body = elementwiseOnDevice(st, flat, red, /*root=*/-1))
    return submitElementwise(type, title, tensors, std::move(st), flat, std::move(body), call);
  return submitElementwise(type, title, tensors, std::move(st), flat,
                           [flat, t, red](Communicator& c, size_t first, size_t count) {
                             roce::algorithms::allreduce(c, elementAt(flat, first), count, t, red.get());
                           },
                           call);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  checkSparseAllreduce(tensors, opts);
  const at::Tensor t = tensors[0];
  const size_t bytes = static_cast<size_t>(t._values().numel()) * t._values().element_size();
  if (t.is_cpu())
    return submit(OpType::ALLREDUCE, "allreduce (sparse)", tensors, CallStaging(),
                  [t](Communicator& c) { t.copy_(sparseAllreduceSum(c, t)); }, callOf(opts), bytes);
  // A device tensor is ordered like a dense call: its indices and values
  // are copied to the host after the caller's work before the call, and the
  // sum goes back on the results stream, where the Work completes. The
  // caller's stream is recorded on the sum's new memory, which the results
  // stream allocated and the caller's kernels read after wait().
  CallStaging st = staging(t);  // refuses a capture
  const at::Tensor indices = st.input(t._indices()).view(t._indices().sizes());
  const at::Tensor values = st.input(t._values()).view(t._values().sizes());
  const c10::Stream caller = c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
  std::shared_ptr<DeviceStaging> device = st.device;
  return submit(OpType::ALLREDUCE, "allreduce (sparse)", tensors, std::move(st),
                [t, indices, values, caller, device](Communicator& c) {
                  sparseAllreduceSumOnDevice(c, t, indices, values, *device, caller);
                },
                callOf(opts), bytes);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "roce: allreduce_coalesced needs at least one tensor");
  for (const auto& x : tensors) checkSameDeviceAndDtype(x, tensors[0], "allreduce_coalesced");
  return allreduceInPlace(OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, opts.reduceOp, callOf(opts));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  checkSingle(tensors, "reduce");
  checkRank(opts.rootRank, getSize(), "root", "reduce");
  const int root = static_cast<int>(opts.rootRank);
  const DataType t = reductionType(tensors[0], "reduce");
  CallStaging st = staging(tensors[0]);
  const CallReduction red(opts.reduceOp, t, st);
  const at::Tensor h = st.inPlace(tensors, /*read=*/true, /*write=*/getRank() == root);
  if (auto body = elementwiseOnDevice(st, h, red, root))
    return submitElementwise(OpType::REDUCE, "reduce", tensors, std::move(st), h, std::move(body), callOf(opts));
  return submitElementwise(OpType::REDUCE, "reduce", tensors, std::move(st), h,
                           [h, t, red, root](Communicator& c, size_t first, size_t count) {
                             roce::algorithms::reduce(c, elementAt(h, first), count, t, red.get(), root);
                           },
                           callOf(opts));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  checkSingle(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "roce: allgather takes one list of output tensors, got ", outputs.size());
  checkList(outputs[0], inputs[0], getSize(), "allgather", "output");
  CallStaging st = staging(inputs[0], /*peer=*/-1, getSize() * inputs[0].nbytes());
  const at::Tensor in = st.input(inputs[0]), flat = st.outputs(outputs[0]);
  return submit(OpType::ALLGATHER, "allgather", outputs[0], std::move(st),
                [in, flat](Communicator& c) { roce::algorithms::allgather(c, in.data_ptr(), flat.data_ptr(), bytesOf(in)); },
                callOf(opts), bytesOf(in));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  checkSameDeviceAndDtype(output, input, "all_gather_into_tensor");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "roce: all_gather_into_tensor: output has ", output.numel(),
              " elements, expected world size (", getSize(), ") x input (", input.numel(), ")");
  CallStaging st = staging(input, /*peer=*/-1, output.nbytes());
  const int64_t p = getSize(), pieceElems = blockPieceElems(st, output, input);
  const at::Tensor in = st.input(input), out = st.rows(output, p, /*read=*/false, /*write=*/true);
  const size_t elementSize = in.element_size();
  return submitInPieces(OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output}, std::move(st), in.numel(),
                        pieceElems,
                        [in, out, p, elementSize](Communicator& c, size_t first, size_t count) {
                          roce::algorithms::allgather(c, elementAt(in, first), elementAt(out, p * first), count * elementSize);
                        },
                        callOf(opts), bytesOf(in));
}

// outputLists[r][i] receives rank r's inputs[i] (torch's all_gather_coalesced).
// The inputs travel as one block per rank: a single allgather of their
// concatenation, whose block r is sliced into outputLists[r].
c10::intrusive_ptr<c10d::Work> RoceBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) {
  const char* op = "allgather_coalesced";
  TORCH_CHECK(!inputs.empty(), "roce: ", op, " needs at least one input tensor");
  TORCH_CHECK(outputLists.size() == static_cast<size_t>(getSize()), "roce: ", op, ": expected one output list per rank (",
              getSize(), "), got ", outputLists.size());
  for (const auto& x : inputs) checkSameDeviceAndDtype(x, inputs[0], op);
  std::vector<at::Tensor> all;
  for (size_t r = 0; r < outputLists.size(); ++r) {
    TORCH_CHECK(outputLists[r].size() == inputs.size(), "roce: ", op, ": output list ", r, " has ",
                outputLists[r].size(), " tensors but there are ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkSameDeviceAndDtype(outputLists[r][i], inputs[i], op);
      TORCH_CHECK(outputLists[r][i].numel() == inputs[i].numel(), "roce: ", op, ": output ", r, "/", i, " has ",
                  outputLists[r][i].numel(), " elements but input ", i, " has ", inputs[i].numel());
      all.push_back(outputLists[r][i]);
    }
  }
  size_t inputBytes = 0;
  for (const auto& x : inputs) inputBytes += x.nbytes();
  CallStaging st = staging(inputs[0], /*peer=*/-1, getSize() * inputBytes);
  const at::Tensor in = st.inputs(inputs), flat = st.outputs(all);
  const size_t bytes = bytesOf(in);
  return submit(OpType::ALLGATHER_COALESCED, op, all, std::move(st),
                [in, flat, bytes](Communicator& c) { roce::algorithms::allgather(c, in.data_ptr(), flat.data_ptr(), bytes); },
                callOf(opts), bytes);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "roce: allgather_into_tensor_coalesced: ", inputs.size(),
              " inputs but ", outputs.size(), " outputs");
  TORCH_CHECK(!inputs.empty(), "roce: allgather_into_tensor_coalesced needs at least one tensor");
  std::vector<at::Tensor> ins, outs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkSameDevice(outputs[i], inputs[0], "allgather_into_tensor_coalesced");
    checkSameDeviceAndDtype(outputs[i], inputs[i], "allgather_into_tensor_coalesced");
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize(), "roce: allgather_into_tensor_coalesced: output ",
                i, " has ", outputs[i].numel(), " elements, expected ", inputs[i].numel() * getSize());
  }
  size_t largest = 0;
  for (const auto& x : outputs) largest = std::max(largest, x.nbytes());
  CallStaging st = staging(inputs[0], /*peer=*/-1, largest);
  const size_t bytes = stagePairs(st, inputs, outputs, ins, outs);
  return submit(allgatherIntoTensorCoalesced<OpType>(0), "allgather_into_tensor_coalesced", outputs, std::move(st),
                [ins, outs](Communicator& c) {
                  for (size_t i = 0; i < ins.size(); ++i)
                    roce::algorithms::allgather(c, ins[i].data_ptr(), outs[i].data_ptr(), bytesOf(ins[i]));
                },
                callOf(opts), bytes);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  checkSingle(inputs, "gather");
  checkRank(opts.rootRank, getSize(), "root", "gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> value;
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1, "roce: gather: the root passes one list of output tensors, got ", outputs.size());
    checkList(outputs[0], inputs[0], getSize(), "gather", "output");
    value = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "roce: gather: only the root (rank ", root, ") may pass output tensors");
  }
  CallStaging st = staging(inputs[0], /*peer=*/-1, getSize() * inputs[0].nbytes());
  const at::Tensor in = st.input(inputs[0]);
  const at::Tensor flat = value.empty() ? at::Tensor() : st.outputs(value);
  CallOptions call = callOf(opts);
  call.dtype = inputs[0].scalar_type();  // non-roots pass no outputs
  return submit(OpType::GATHER, "gather", value, std::move(st),
                [in, flat, root](Communicator& c) {
                  roce::algorithms::gather(c, in.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, bytesOf(in), root);
                },
                call, bytesOf(in));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  checkSingle(outputs, "scatter");
  checkRank(opts.rootRank, getSize(), "root", "scatter");
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = getRank() == root;
  if (isRoot) {
    TORCH_CHECK(inputs.size() == 1, "roce: scatter: the root passes one list of input tensors, got ", inputs.size());
    checkList(inputs[0], outputs[0], getSize(), "scatter", "input");
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "roce: scatter: only the root (rank ", root, ") may pass input tensors");
  }
  CallStaging st = staging(outputs[0], /*peer=*/-1, getSize() * outputs[0].nbytes());
  const at::Tensor flat = isRoot ? st.inputs(inputs[0]) : at::Tensor();
  const at::Tensor out = st.output(outputs[0]);
  return submit(OpType::SCATTER, "scatter", outputs, std::move(st),
                [out, flat, root](Communicator& c) {
                  roce::algorithms::scatter(c, flat.defined() ? flat.data_ptr() : nullptr, out.data_ptr(), bytesOf(out), root);
                },
                callOf(opts), bytesOf(out));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  checkSingle(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, "roce: reduce_scatter takes one list of input tensors, got ", inputs.size());
  checkList(inputs[0], outputs[0], getSize(), "reduce_scatter", "input");
  const DataType t = reductionType(outputs[0], "reduce_scatter");
  CallStaging st = staging(outputs[0]);
  const CallReduction red(opts.reduceOp, t, st);
  const at::Tensor flat = st.inputs(inputs[0]), out = st.output(outputs[0]);
  auto body = reduceScatterBody(st, flat, out, t, red);
  return submitInPieces(OpType::REDUCE_SCATTER, "reduce_scatter", outputs, std::move(st), out.numel(),
                        /*pieceElems=*/0, std::move(body), callOf(opts), bytesOf(flat));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts) {
  checkSameDeviceAndDtype(output, input, "reduce_scatter_tensor");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "roce: reduce_scatter_tensor: input has ", input.numel(),
              " elements, expected world size (", getSize(), ") x output (", output.numel(), ")");
  const DataType t = reductionType(output, "reduce_scatter_tensor");
  CallStaging st = staging(input);
  const CallReduction red(opts.reduceOp, t, st);
  const int64_t pieceElems = blockPieceElems(st, input, output);
  const at::Tensor in = st.rows(input, getSize(), /*read=*/true, /*write=*/false), out = st.output(output);
  auto body = reduceScatterBody(st, in, out, t, red, pieceElems);
  return submitInPieces(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output}, std::move(st), out.numel(),
                        pieceElems, std::move(body), callOf(opts), bytesOf(in));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "roce: reduce_scatter_tensor_coalesced: ", inputs.size(),
              " inputs but ", outputs.size(), " outputs");
  TORCH_CHECK(!inputs.empty(), "roce: reduce_scatter_tensor_coalesced needs at least one tensor");
  std::vector<at::Tensor> ins, outs;
  std::vector<DataType> types;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkSameDevice(outputs[i], inputs[0], "reduce_scatter_tensor_coalesced");
    checkSameDeviceAndDtype(outputs[i], inputs[i], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize(), "roce: reduce_scatter_tensor_coalesced: input ",
                i, " has ", inputs[i].numel(), " elements, expected ", outputs[i].numel() * getSize());
    types.push_back(reductionType(outputs[i], "reduce_scatter_tensor_coalesced"));
  }
  CallStaging st = staging(inputs[0]);
  const CallReduction red(opts.reduceOp, types[0], st);
  const size_t bytes = stagePairs(st, inputs, outputs, ins, outs);
  std::vector<std::pair<CollectiveTask::Body, size_t>> bodies;
  for (size_t i = 0; i < ins.size(); ++i)
    bodies.emplace_back(reduceScatterBody(st, ins[i], outs[i], types[i], red.forType(types[i])), outs[i].numel());
  return submit(reduceScatterTensorCoalesced<OpType>(0), "reduce_scatter_tensor_coalesced", outputs, std::move(st),
                [bodies](Communicator& c) {
                  for (const auto& [body, elems] : bodies) body(c, 0, elems);
                },
                callOf(opts), bytes);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& outputSplits,
                                                          std::vector<int64_t>& inputSplits,
                                                          const c10d::AllToAllOptions& opts) {
  checkSameDeviceAndDtype(output, input, "all_to_all_single");
  const int n = getSize();
  auto layout = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which,
                    std::vector<size_t>& bytes, std::vector<size_t>& offsets) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t rowBytes = rows == 0 ? 0 : t.numel() / rows * t.element_size();
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      TORCH_CHECK(rows % n == 0, "roce: all_to_all_single: ", which, " dim 0 (", rows,
                  ") is not divisible by the world size (", n, "); pass explicit split sizes");
      s.assign(n, rows / n);
    }
    TORCH_CHECK(static_cast<int>(s.size()) == n, "roce: all_to_all_single: ", s.size(), " ", which,
                " split sizes for a group of ", n);
    int64_t sum = 0;
    for (int64_t x : s) {
      TORCH_CHECK(x >= 0, "roce: all_to_all_single: negative ", which, " split size ", x);
      sum += x;
    }
    TORCH_CHECK(sum == rows, "roce: all_to_all_single: ", which, " split sizes add up to ", sum,
                " but dim 0 of the ", which, " tensor is ", rows);
    size_t at = 0;
    for (int64_t x : s) {
      offsets.push_back(at);
      bytes.push_back(static_cast<size_t>(x) * rowBytes);
      at += bytes.back();
    }
  };
  std::vector<size_t> sendBytes, sendOff, recvBytes, recvOff;
  layout(input, inputSplits, "input", sendBytes, sendOff);
  layout(output, outputSplits, "output", recvBytes, recvOff);
  const int me = getRank();
  TORCH_CHECK(sendBytes[me] == recvBytes[me], "roce: all_to_all_single: rank ", me, " sends ", sendBytes[me],
              " bytes to itself but expects to receive ", recvBytes[me]);
  CallStaging st = staging(input, /*peer=*/-1, std::max(input.nbytes(), output.nbytes()));
  const at::Tensor in = st.input(input), out = st.output(output);
  return submit(OpType::ALLTOALL_BASE, "all_to_all_single", {output}, std::move(st),
                [=](Communicator& c) {
                  roce::algorithms::alltoallv(c, in.data_ptr(), sendBytes, sendOff, out.data_ptr(), recvBytes, recvOff);
                },
                callOf(opts), bytesOf(in));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  const int n = getSize();
  TORCH_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n,
              "roce: all_to_all: expected ", n, " input and output tensors, got ", inputs.size(), " and ", outputs.size());
  std::vector<size_t> sendBytes, sendOff, recvBytes, recvOff;
  size_t at = 0;
  for (auto& t : inputs) {
    checkSameDeviceAndDtype(t, inputs[0], "all_to_all");
    sendOff.push_back(at);
    sendBytes.push_back(t.numel() * t.element_size());
    at += sendBytes.back();
  }
  at = 0;
  for (auto& t : outputs) {
    checkSameDeviceAndDtype(t, inputs[0], "all_to_all");
    recvOff.push_back(at);
    recvBytes.push_back(t.numel() * t.element_size());
    at += recvBytes.back();
  }
  const int me = getRank();
  TORCH_CHECK(sendBytes[me] == recvBytes[me], "roce: all_to_all: input and output tensor ", me,
              " (this rank's own block) differ in size");
  CallStaging st =
      staging(inputs[0], /*peer=*/-1, std::max(sendOff.back() + sendBytes.back(), recvOff.back() + recvBytes.back()));
  const at::Tensor flatIn = st.inputs(inputs), flatOut = st.outputs(outputs);
  return submit(OpType::ALLTOALL, "all_to_all", outputs, std::move(st),
                [=](Communicator& c) {
                  roce::algorithms::alltoallv(c, flatIn.data_ptr(), sendBytes, sendOff, flatOut.data_ptr(), recvBytes, recvOff);
                },
                callOf(opts), bytesOf(flatIn));
}

c10::intrusive_ptr<c10d::Work> RoceBackend::barrier(const c10d::BarrierOptions& opts) {
  return submit(OpType::BARRIER, "barrier", {}, CallStaging(), [](Communicator& c) { roce::algorithms::barrier(c); }, callOf(opts),
                0);
}

void RoceBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const auto limit = effective(opts.timeout);
  // Only rank 0 enforces the barrier's timeout; the others wait at least the
  // group's, so that rank 0 is the one to report which rank is missing.
  roce::adapter::monitoredBarrier(*membershipStore_, {getRank(), getSize(), ++monitoredBarriers_, limit, std::max(limit, timeout_), waitAllRanks});
}

c10::intrusive_ptr<c10d::Work> RoceBackend::pointToPoint(OpType type, const char* title, std::vector<at::Tensor>& tensors,
                                                         int peer, int tag) {
  checkSingle(tensors, title);
  const bool sending = type == OpType::SEND;
  if (peer >= 0) {
    checkRank(peer, getSize(), sending ? "destination" : "source", title);
    TORCH_CHECK(peer != getRank(), "roce: ", title, ": rank ", getRank(), " cannot ", sending ? "send to" : "receive from",
                " itself");
  }
  // A receive from any rank may be served by any transport: staged.
  CallStaging st = peer >= 0 ? staging(tensors[0], peer, tensors[0].nbytes()) : staging(tensors[0]);
  const at::Tensor host = sending ? st.input(tensors[0]) : st.output(tensors[0]);
  if (st.device) st.device->start(/*pieceElems=*/0, 0);
  if (estimatingHere()) return estimated(type, title, tensors, bytesOf(host));
  comm();  // refused before it is counted or traced once the group stopped
  const OpLabel what = label(title, bytesOf(host));
  uint64_t tracePos = 0;
  const uint64_t p2pSeq = ++p2ps_;
  if (engine().trace().enabled()) {
    TraceEntry e = traceEntry(type, what, timeout_, collectives_.load(std::memory_order_relaxed), p2pSeq);
    e.p2p = true;
    e.peer = peer;
    e.tag = tag;
    (sending ? e.inElems : e.outElems) = host.numel();
    (sending ? e.inDtype : e.outDtype) = static_cast<int16_t>(host.scalar_type());
    tracePos = engine().trace().record(e);
  }
  auto work = c10::make_intrusive<RoceWork>(type, getRank(), title, tensors);
  work->identify(what.seq, &completionHooks_);
  auto task = std::make_shared<PointToPointTask>(
      work,
      str(what.text(), peer >= 0 ? str(sending ? " to rank " : " from rank ", peer) : " from any rank", " with tag ", tag),
      std::move(st), host, sending ? Request::Kind::Send : Request::Kind::Recv, peer, Communicator::p2pTag(tag));
  task->timeout = timeout_ + timeoutExtensions_.issue(task->timeoutExtension);
  task->tracePos = tracePos;
  coalescing_.issued(work);
  engine().enqueue(std::move(task));
  return work;
}

namespace {

CollectiveKind kindOf(OpType type, const char* title) {
  switch (type) {
    case OpType::ALLREDUCE:
    case OpType::ALLREDUCE_COALESCED: return CollectiveKind::Allreduce;
    case OpType::REDUCE: return CollectiveKind::Reduce;
    case OpType::BROADCAST: return CollectiveKind::Broadcast;
    case OpType::ALLGATHER:
    case OpType::_ALLGATHER_BASE:
    case OpType::ALLGATHER_COALESCED: return CollectiveKind::Allgather;
    case OpType::REDUCE_SCATTER:
    case OpType::_REDUCE_SCATTER_BASE: return CollectiveKind::ReduceScatter;
    case OpType::GATHER: return CollectiveKind::Gather;
    case OpType::SCATTER: return CollectiveKind::Scatter;
    case OpType::ALLTOALL:
    case OpType::ALLTOALL_BASE: return CollectiveKind::AllToAll;
    case OpType::BARRIER: return CollectiveKind::Barrier;
    case OpType::SEND:
    case OpType::RECV:
    case OpType::RECVANYSOURCE: return CollectiveKind::PointToPoint;
    default: break;
  }
  // The coalesced tensor calls, whose OpType values older torch lacks.
  const std::string_view t(title);
  if (t.starts_with("allgather")) return CollectiveKind::Allgather;
  if (t.starts_with("reduce_scatter")) return CollectiveKind::ReduceScatter;
  return CollectiveKind::Allreduce;
}

}  // namespace

bool RoceBackend::estimatingHere() {
  if (!estimating_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> g(estimateMu_);
  return estimating_.load() && estimatingThread_ == std::this_thread::get_id();
}

#ifdef ROCE_TORCH_COMPLETION_HOOKS
void RoceBackend::startTimeEstimate() {
  std::lock_guard<std::mutex> g(estimateMu_);
  TORCH_CHECK(!estimating_.load(), "roce: startTimeEstimate() was called twice without endTimeEstimate() in between");
  estimatedSeconds_ = 0;
  estimatingThread_ = std::this_thread::get_id();
  estimateStart_ = std::chrono::steady_clock::now();
  estimateWarned_ = false;
  estimating_.store(true, std::memory_order_release);
}

float RoceBackend::endTimeEstimate() {
  std::lock_guard<std::mutex> g(estimateMu_);
  TORCH_CHECK(estimating_.load(), "roce: endTimeEstimate() was called without startTimeEstimate()");
  estimating_.store(false, std::memory_order_release);
  return static_cast<float>(estimatedSeconds_ * 1e6);
}
#endif

c10::intrusive_ptr<c10d::Work> RoceBackend::estimated(OpType type, const char* title, std::vector<at::Tensor> outputs,
                                                      size_t bytes) {
  TORCH_CHECK(engine().hasComm(), "roce: ", title, " issued to estimate its time on a group that was shut down");
  const Communicator& c = comm();
  const double seconds = estimateCall(c.config(), groupShape(c), kindOf(type, title), bytes);
  {
    std::lock_guard<std::mutex> g(estimateMu_);
    estimatedSeconds_ += seconds;
    // An estimate lasts as long as the calls it is handed; one still open a
    // minute later is most likely one whose body raised (torch's
    // _time_estimator then never calls endTimeEstimate), and every call of
    // this thread would go on being skipped.
    const auto open = std::chrono::steady_clock::now() - estimateStart_;
    if (!estimateWarned_ && open > std::chrono::minutes(1)) {
      estimateWarned_ = true;
      ROCE_WARN("roce: rank ", getRank(), ": ", title, " was only estimated, not run: startTimeEstimate() was called ",
                std::chrono::duration_cast<std::chrono::seconds>(open).count(),
                " s ago on this thread and endTimeEstimate() not yet. Calls of this thread are not run until it is "
                "(did the code inside torch's _time_estimator raise?)");
    }
  }
  auto work = c10::make_intrusive<RoceWork>(type, getRank(), title, std::move(outputs));
  work->complete(nullptr);
  return work;
}

c10::intrusive_ptr<c10d::Work> RoceBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return pointToPoint(OpType::SEND, "send", tensors, dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return pointToPoint(OpType::RECV, "recv", tensors, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> RoceBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return pointToPoint(OpType::RECVANYSOURCE, "recv", tensors, -1, tag);
}

}  // namespace roce::adapter
