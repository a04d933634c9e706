#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "window.hpp"

#ifdef C10D_BACKEND_HAS_WINDOW
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "../comm/communicator.hpp"
#include "../common/backoff.hpp"
#include "../window/window_service.hpp"
#include "backend.hpp"
#include "work.hpp"

namespace roce::adapter {

namespace {

constexpr int kMaxPublishedDims = 8;
const char* const kSegmentPrefix = "roce_win";

void dropWindowMemory(void* ref) { delete static_cast<std::shared_ptr<WindowMemory>*>(ref); }

// The window memory a storage's DataPtr holds, or null if it holds another.
WindowMemory* windowMemoryOf(const c10::Storage& storage) {
  if (storage.data_ptr().get_deleter() != &dropWindowMemory) return nullptr;
  return static_cast<std::shared_ptr<WindowMemory>*>(storage.data_ptr().get_context())->get();
}

// A Work that is done when it is made (puts and signals to a peer on this
// machine: the caller's thread did them).
c10::intrusive_ptr<c10d::Work> doneWork(c10d::OpType type, int rank, const char* title) {
  auto w = c10::make_intrusive<RoceWork>(type, rank, title, std::vector<at::Tensor>{});
  w->complete(nullptr);
  return w;
}

}  // namespace

struct RoceWindow::Published {
  char segment[96] = {};
  uint64_t segmentBytes = 0;
  uint64_t windowBytes = 0;
  int32_t dtype = 0;
  int32_t ndim = 0;
  int64_t sizes[kMaxPublishedDims] = {};
  // Its signal counts and window exposed to the peers on other machines
  // (all zero: not), and where in that memory the window starts.
  RemoteMemory remote;
  uint64_t windowAt = 0;
  uint8_t mappable = 0;  // this rank lets peers on its machine map its window (not ROCE_PG_FORCE_NETWORK)
  uint8_t ok = 0;        // this rank registered its tensor
  uint8_t pad[6] = {};
};

void WindowShared::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (!failed.empty()) return;
    failed = why;
  }
  ended.notify_all();
  if (board) board->bell.notify();  // waits learn it
}

std::string WindowShared::failure() {
  std::lock_guard<std::mutex> g(mu);
  return failed;
}

void RoceBackend::failWindows(const std::string& why) {
  std::lock_guard<std::mutex> g(windowsMu_);
  if (windowsFailure_.empty()) windowsFailure_ = why;
  for (auto& w : windowStates_)
    if (auto s = w.lock()) s->fail(why);
  windowStates_.clear();
}

namespace {

// wait_signal's Work: done once the peer's count reached the ticket the
// call drew, so waits complete in the order they were issued.
class SignalWaitWork : public c10d::Work {
 public:
  // `written`: the peer writes its count by RDMA (this rank exposed its
  // window to it), which wakes nobody: the wait polls, backing off.
  SignalWaitWork(std::shared_ptr<WindowShared> shared, int rank, int peer, uint32_t ticket,
                 std::chrono::milliseconds timeout, bool written)
      : c10d::Work(rank, c10d::OpType::RECV),
        shared_(std::move(shared)), rank_(rank), peer_(peer), ticket_(ticket), timeout_(timeout), written_(written) {}

  // Also true once the wait cannot complete any more (wait() then raises why).
  bool isCompleted() override { return shared_->board->reached(peer_, ticket_) || !shared_->failure().empty(); }
  // Raises what every roce Work raises (torch.distributed.DistBackendError).
  bool wait(std::chrono::milliseconds timeout) override {
    try {
      return waitFor(timeout);
    } catch (const Error&) {
      std::rethrow_exception(toTorchError(std::current_exception()));
    }
  }

 private:
  bool waitFor(std::chrono::milliseconds timeout) {
    const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    WindowBoard& board = *shared_->board;
    auto ready = [&] { return board.reached(peer_, ticket_); };
    Backoff backoff;
    Clock::time_point nextCheck{};
    while (!ready()) {
      if (written_) {
        // The spins and yields between looks at the failure and the clock.
        backoff.pause();
        if (!backoff.sleeping() && Clock::now() < nextCheck) continue;
        nextCheck = Clock::now() + std::chrono::milliseconds(1);
      }
      const std::string why = shared_->failure();
      if (!why.empty())
        throwComm(str("window wait_signal on rank ", rank_, " for rank ", peer_, " cannot complete: ", why));
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        throwTimeout(str("window wait_signal on rank ", rank_, " timed out after ", limit.count(),
                         " ms waiting for signal ", ticket_, " from rank ", peer_, " (", board.counts()[peer_].arrived.load(),
                         " arrived): is rank ", peer_, " calling signal(", rank_, ")?"));
      if (written_) continue;
      const auto slice = std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(50));
      board.bell.sleep(ready, static_cast<long>(slice.count()));
    }
    return true;
  }

  std::shared_ptr<WindowShared> shared_;
  int rank_, peer_;
  uint32_t ticket_;
  std::chrono::milliseconds timeout_;
  bool written_;
};

}  // namespace

RoceWindow::RoceWindow(c10::intrusive_ptr<RoceBackend> backend, uint64_t id)
    : backend_(std::move(backend)), id_(id), rank_(backend_->getRank()), size_(backend_->getSize()),
      shared_(std::make_shared<WindowShared>()) {}

RoceWindow::~RoceWindow() {
  // Dropped after its group failed or was reconfigured (deregistering would
  // only raise): the tensor may be registered in a new window.
  if (registered_ && memory_ && !shared_->failure().empty()) memory_->registered = false;
  if (registered_ && shared_->failure().empty())
    ROCE_WARN("roce: rank ", rank_, ": window ", id_, " was dropped without tensor_deregister(): it keeps its memory "
              "and serves its peers until the group ends, and peers that deregister wait for this rank");
}

std::chrono::milliseconds RoceWindow::timeoutOf(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? backend_->timeout_ : requested;
}

void RoceWindow::allgather(const void* mine, void* all, size_t each) {
  at::Tensor in = at::empty({static_cast<int64_t>(each)}, at::kByte);
  std::memcpy(in.data_ptr(), mine, each);
  at::Tensor out = at::empty({static_cast<int64_t>(each) * size_}, at::kByte);
  c10d::AllgatherOptions opts;
  opts.timeout = backend_->timeout_;
  backend_->_allgather_base(out, in, opts)->wait();
  std::memcpy(all, out.data_ptr(), each * static_cast<size_t>(size_));
}

namespace {

// Why `tensor` cannot become a window's memory here, or "" if it can.
// Registration moves the storage into shared memory, so it must be memory
// torch's CPU allocator gave (not numpy's, a shared or pinned block) or a
// window's that is no longer registered, with no pointer into it taken
// before and no operation in flight on it (the old bytes are freed).
std::string unregistrable(const at::Tensor& tensor) {
  if (!tensor.defined()) return "the tensor is undefined";
  if (!tensor.device().is_cpu())
    return str("tensor_register takes CPU tensors; this one is on ", tensor.device().str(),
               " (device windows are not supported yet)");
  if (tensor.is_sparse() || !tensor.is_contiguous())
    return "tensor_register takes a contiguous dense tensor (call .contiguous() first)";
  const c10::Storage& storage = tensor.storage();
  if (static_cast<size_t>(tensor.storage_offset()) * tensor.element_size() + tensor.nbytes() > storage.nbytes())
    return str("the tensor's ", tensor.nbytes(), " bytes reach past its storage of ", storage.nbytes(),
               " (a resize_ that failed leaves its sizes grown: resize_ it back first)");
  if (WindowMemory* mem = windowMemoryOf(storage)) {
    if (mem->registered.load())
      return "this tensor's memory is registered in another window (deregister it there, or register a clone())";
    return {};
  }
  if (storage.nbytes() > 0 && storage.data_ptr().get_deleter() != c10::GetDefaultCPUAllocator()->raw_deleter())
    return "registration moves the tensor's memory into shared memory, and this tensor's memory is not torch's "
           "own CPU allocation (numpy's, shared or pinned memory?): register a clone()";
  return {};
}

}  // namespace

std::vector<uint8_t> RoceWindow::agree(bool ok) {
  const uint8_t mine = ok ? 1 : 0;
  std::vector<uint8_t> all(static_cast<size_t>(size_));
  allgather(&mine, all.data(), 1);
  return all;
}

std::unique_ptr<transport::ExposedMemory> RoceWindow::exposeWindow(const std::vector<int>& served,
                                                                  WindowBoard* board) {
  std::string why;
  // The signal counts (each served peer writes its own) through the window:
  // the storage's bytes before the window (a view's offset) lie between.
  char* from = reinterpret_cast<char*>(board->counts());
  auto exposure = backend_->comm().expose(served, from, static_cast<size_t>(board->window() + board->windowBytes - from),
                                                   &why);
  // Not an error: peers' puts then go through this rank's progress thread.
  if (!exposure && !why.empty())
    ROCE_WARN("roce: rank ", rank_, ": window ", id_, " cannot be written or read by RDMA (", why,
              "); puts, gets and signals from other machines go through this rank's progress thread instead");
  return exposure;
}

void RoceWindow::tensor_register(const at::Tensor& tensor, bool owning) {
  TORCH_CHECK(!backend_->stopping_.load() && backend_->engine().hasComm(), "roce: window on rank ", rank_,
              ": tensor_register() after the group was shut down or aborted");
  rank_ = backend_->getRank();  // a reconfigure may have changed them since the window was made
  size_ = backend_->getSize();
  // Every rank takes part in both exchanges even when it cannot register,
  // so all of them raise together instead of the others waiting for the
  // timeout; nothing of the tensor changes until every rank can.
  Published me;
  std::string refused;
  {
    std::shared_lock<std::shared_mutex> state(stateMu_);
    if (registered_) refused = "a tensor is already registered; call tensor_deregister() first";
  }
  if (refused.empty()) refused = unregistrable(tensor);
  // A peer killed during the exchanges leaves its segment's name behind
  // (its lock is free now); a rank that failed otherwise unlinks its own.
  struct SweepOnFailure {
    int before = std::uncaught_exceptions();
    ~SweepOnFailure() {
      if (std::uncaught_exceptions() > before) ShmSegment::sweepLeftovers(kSegmentPrefix);
    }
  } sweepOnFailure;
  std::shared_ptr<ShmSegment> seg;
  WindowBoard* board = nullptr;
  if (refused.empty()) {
    try {
      seg = std::make_shared<ShmSegment>(
          ShmSegment::create(WindowBoard::headBytes(size_) + tensor.storage().nbytes(), kSegmentPrefix));
      board = WindowBoard::init(seg->data(), size_, static_cast<size_t>(tensor.storage_offset()) * tensor.element_size(),
                                tensor.nbytes());
      std::snprintf(me.segment, sizeof(me.segment), "%s", seg->name().c_str());
      me.segmentBytes = seg->size();
      me.windowBytes = tensor.nbytes();
      me.dtype = static_cast<int32_t>(tensor.scalar_type());
      if (tensor.dim() <= kMaxPublishedDims) {
        me.ndim = static_cast<int32_t>(tensor.dim());
        for (int64_t d = 0; d < tensor.dim(); ++d) me.sizes[d] = tensor.size(d);
      } else {
        me.ndim = 1;
        me.sizes[0] = tensor.numel();
      }
      me.ok = 1;
    } catch (const std::exception& e) {
      refused = e.what();
      seg.reset();
    }
  }
  // The group's own setting (formation may have taken the leader's), so the
  // same on every rank: which peers are served is known before the exchange.
  me.mappable = backend_->comm().config().placement.forceNetwork ? 0 : 1;
  const auto& topo = backend_->comm().topology();
  std::vector<int> served;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && !(topo.nodeOf[r] == topo.nodeOf[rank_] && me.mappable)) served.push_back(r);
  std::unique_ptr<transport::ExposedMemory> exposure;
  if (me.ok && !served.empty()) exposure = exposeWindow(served, board);
  if (exposure) {
    me.remote = exposure->describe();
    me.windowAt = static_cast<uint64_t>(board->window() - reinterpret_cast<char*>(board->counts()));
  }
  std::vector<Published> all(static_cast<size_t>(size_));
  allgather(&me, all.data(), sizeof(Published));
  TORCH_CHECK(refused.empty(), "roce: window on rank ", rank_, ": ", refused);
  for (int r = 0; r < size_; ++r)
    TORCH_CHECK(all[static_cast<size_t>(r)].ok, "roce: window on rank ", rank_, ": rank ", r,
                " could not register its tensor (its error says why); no rank registered");

  // The tensor, its views and the window become the same memory (queued
  // collectives before this call have finished: the exchange ran after
  // them). A storage that grew would leave it: resizing is refused.
  c10::Storage storage = tensor.storage();
  if (storage.nbytes()) std::memcpy(board->data(), storage.data(), storage.nbytes());
  auto memory = std::make_shared<WindowMemory>();
  memory->segment = seg;
  // Until the registration completes, any failure (an exchange that throws
  // included) leaves the tensor free to be registered again.
  struct RegisteredOnlyIfDone {
    WindowMemory& m;
    bool done = false;
    ~RegisteredOnlyIfDone() {
      if (!done) m.registered = false;
    }
  } registeredOnlyIfDone{*memory};
  storage.set_data_ptr_noswap(
      at::DataPtr(board->data(), new std::shared_ptr<WindowMemory>(memory), &dropWindowMemory, tensor.device()));
  storage.unsafeGetStorageImpl()->set_resizable(false);

  std::vector<Peer> peers(static_cast<size_t>(size_));
  std::string failed;
  try {
    for (int r = 0; r < size_; ++r) {
      const Published& p = all[static_cast<size_t>(r)];
      Peer& peer = peers[static_cast<size_t>(r)];
      peer.bytes = p.windowBytes;
      peer.dtype = static_cast<c10::ScalarType>(p.dtype);
      peer.sizes.assign(p.sizes, p.sizes + std::clamp(p.ndim, 0, kMaxPublishedDims));
      if (r == rank_) {
        peer.mapped = true;
        peer.segment = seg;
        peer.board = board;
      } else if (topo.nodeOf[r] == topo.nodeOf[rank_] && p.mappable && me.mappable) {
        peer.mapped = true;
        peer.segment = std::make_shared<ShmSegment>(
            ShmSegment::open(std::string(p.segment, strnlen(p.segment, sizeof(p.segment))), p.segmentBytes, r));
        peer.board = reinterpret_cast<WindowBoard*>(peer.segment->data());
        if (peer.board->magic != WindowBoard::kMagic || peer.board->ranks != static_cast<uint32_t>(size_) ||
            peer.board->windowBytes != p.windowBytes)
          throwComm(str("rank ", r, "'s window segment ", p.segment,
                        " is not the window it published (another roce version on this machine?)"));
      } else {
        peer.remote = p.remote;
        peer.windowAt = p.windowAt;
      }
    }
  } catch (const std::exception& e) {
    failed = e.what();
  }
  // Every peer mapped what it needs before the names go.
  const std::vector<uint8_t> mapped = agree(failed.empty());
  seg->unlink();
  TORCH_CHECK(failed.empty(), "roce: window on rank ", rank_, ": ", failed);
  for (int r = 0; r < size_; ++r)
    TORCH_CHECK(mapped[static_cast<size_t>(r)], "roce: window on rank ", rank_, ": rank ", r,
                " could not map its peers' windows (its error says why); no rank registered");

  auto shared = std::make_shared<WindowShared>();
  shared->mine = seg;
  shared->board = board;
  shared->order = std::make_shared<WindowOrder>(size_);
  std::string failedBefore;
  {
    std::lock_guard<std::mutex> g(backend_->windowsMu_);
    auto& states = backend_->windowStates_;
    states.erase(std::remove_if(states.begin(), states.end(), [](const auto& w) { return w.expired(); }), states.end());
    states.push_back(shared);
    failedBefore = backend_->windowsFailure_;
  }
  if (!failedBefore.empty()) shared->fail(failedBefore);
  std::unique_lock<std::shared_mutex> state(stateMu_);
  shared_ = shared;
  memory_ = memory;
  peers_ = std::move(peers);
  served_ = std::move(served);
  held_ = owning ? tensor : at::Tensor();
  tickets_.assign(static_cast<size_t>(size_), 0);
  signalsSent_.assign(static_cast<size_t>(size_), 0);
  exposed_ = me.remote.exposed();
  tagId_ = ++backend_->windowRegistrations_;
  registered_ = true;
  registeredOnlyIfDone.done = true;
  state.unlock();
  // Without a service (the group failed already) the exposure goes here.
  if (!served_.empty() && failedBefore.empty()) startService(served_, std::move(exposure));
}

void RoceWindow::startService(const std::vector<int>& served, std::unique_ptr<transport::ExposedMemory> exposure) {
  {
    std::lock_guard<std::mutex> g(shared_->mu);
    shared_->serving = true;
  }
  auto task = std::make_shared<WindowService>(shared_->mine, shared_->board, tagId_, served,
                                              str("window ", id_, " of rank ", rank_), std::move(exposure));
  std::weak_ptr<WindowShared> weak = shared_;
  task->onEnd = [weak](std::exception_ptr e, std::unique_ptr<transport::ExposedMemory> exposure) {
    auto s = weak.lock();
    if (!s) return;  // the exposure goes here: nobody deregisters any more
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& err) {
        s->fail(err.what());
      } catch (...) {
        s->fail("its service failed");
      }
    }
    {
      std::lock_guard<std::mutex> g(s->mu);
      s->serving = false;
      s->exposure = std::move(exposure);
    }
    s->ended.notify_all();
  };
  backend_->engine().enqueue(std::move(task));
}

c10::intrusive_ptr<c10d::Work> RoceWindow::sendToServed(WindowOp op, int peer, const at::Tensor& src,
                                                        const char* title, std::chrono::milliseconds timeout,
                                                        const WindowShared& shared) {
  std::vector<at::Tensor> tensors;
  if (src.defined()) tensors.push_back(src);
  auto work = c10::make_intrusive<RoceWork>(
      static_cast<WindowOpKind>(op.kind) == WindowOpKind::Get ? c10d::OpType::RECV : c10d::OpType::SEND, rank_, title,
      tensors);
  const auto kind = static_cast<WindowOpKind>(op.kind);
  static const Peer kNone;
  const Peer& target = peers_.empty() ? kNone : peers_[static_cast<size_t>(peer)];  // deregistering: closes only
  // One-sided where the peer exposed its window: a signal, a put or get with
  // bytes (WindowSendTask decides alike); an empty put or get is a message.
  const RemoteMemory* remote = kind == WindowOpKind::Close ? nullptr : &target.remote;
  const bool oneSided = remote && remote->exposed() && (kind == WindowOpKind::Signal || op.bytes > 0);
  uint32_t signalCount = 0;
  // A signal's count and its place in the engine's queue are taken together:
  // written counts land in queue order (WindowOrder), so they must grow in it.
  std::unique_lock<std::mutex> signalOrder(signalMu_, std::defer_lock);
  if (oneSided && kind == WindowOpKind::Signal) signalOrder.lock();
  if (oneSided) {
    // Where in the peer's exposed memory: this rank's signal count, or the window.
    op.offset = kind == WindowOpKind::Signal ? static_cast<uint64_t>(rank_) * sizeof(SignalCount)
                                             : target.windowAt + op.offset;
    // A signal task that failed leaves its count used: the group breaks on
    // any failure of a posted write (a corrupt key included), so no later
    // count is ever written past a lost one.
    if (kind == WindowOpKind::Signal) signalCount = ++signalsSent_[static_cast<size_t>(peer)];
  }
  auto task = std::make_shared<WindowSendTask>(src.defined() ? std::make_shared<at::Tensor>(src) : nullptr, tagId_,
                                               peer, op, src.defined() ? src.data_ptr() : nullptr,
                                               str(title, " of window ", id_, " from rank ", rank_, " to rank ", peer,
                                                   op.bytes ? str(" (", op.bytes, " bytes)") : std::string()),
                                               shared.order, oneSided ? remote : nullptr,
                                               oneSided && src.defined() ? storageOwner(src) : BufferOwner{},
                                               signalCount);
  // As the group's other operations: ephemeral timeout extensions apply,
  // and inside a coalescing region the batch's Work includes this one.
  task->timeout = timeout + backend_->timeoutExtensions_.issue(task->timeoutExtension);
  task->onEnd = [work](std::exception_ptr e) { work->complete(e); };
  backend_->coalescing_.issued(work);
  backend_->engine().enqueue(std::move(task));
  return work;
}

void RoceWindow::tensor_deregister() {
  std::unique_lock<std::shared_mutex> state(stateMu_);
  TORCH_CHECK(registered_, "roce: window on rank ", rank_, ": tensor_deregister() without a registered tensor");
  // Whatever happens below, this rank's registration ends here.
  std::shared_ptr<WindowShared> shared = std::move(shared_);
  std::shared_ptr<WindowMemory> memory = std::move(memory_);
  std::vector<int> served = std::move(served_);
  shared_ = std::make_shared<WindowShared>();
  registered_ = false;
  peers_.clear();
  at::Tensor held = std::move(held_);  // dropped after the lock: freeing it may take the GIL
  state.unlock();
  held = at::Tensor();
  struct Release {
    WindowMemory& m;
    ~Release() { m.registered = false; }
  } release{*memory};
  const std::string before = shared->failure();
  TORCH_CHECK(before.empty(), "roce: window on rank ", rank_, ": tensor_deregister() after its group stopped serving it: ",
              before);
  // Ranks on other machines learn it by a close, which ends their service
  // for this rank once every put before it landed.
  std::string failed;
  try {
    WindowOp close;
    close.kind = static_cast<uint32_t>(WindowOpKind::Close);
    std::vector<c10::intrusive_ptr<c10d::Work>> closes;
    for (int peer : served)
      closes.push_back(sendToServed(close, peer, at::Tensor(), "window close", backend_->timeout_, *shared));
    for (auto& w : closes) w->wait(kNoTimeout);
    if (!served.empty()) {
      std::unique_lock<std::mutex> g(shared->mu);
      if (!shared->ended.wait_for(g, backend_->timeout_, [&] { return !shared->serving; }))
        failed = "timed out waiting for the ranks on other machines to deregister too (it is collective)";
    }
  } catch (const std::exception& e) {
    failed = e.what();
  }
  {
    // Unpinned here, not on the progress thread that ended the service.
    std::unique_ptr<transport::ExposedMemory> exposure;
    {
      std::lock_guard<std::mutex> g(shared->mu);
      exposure = std::move(shared->exposure);
    }
  }
  // Peers on this machine may read or write this window until they
  // deregister too; every rank takes part, whatever happened above.
  const std::vector<uint8_t> done = agree(failed.empty());
  const std::string during = shared->failure();
  // wait_signal calls issued before (async, or on other threads) would
  // otherwise wait for their timeout: no signal comes any more.
  shared->fail("its tensor was deregistered");
  TORCH_CHECK(failed.empty(), "roce: window on rank ", rank_, ": tensor_deregister() failed: ", failed);
  TORCH_CHECK(during.empty(), "roce: window on rank ", rank_, ": its service failed before tensor_deregister(): ", during);
  for (int r = 0; r < size_; ++r)
    TORCH_CHECK(done[static_cast<size_t>(r)], "roce: window on rank ", rank_, ": rank ", r,
                "'s tensor_deregister() failed (its error says why)");
}

RoceWindow::Peer& RoceWindow::peerFor(int64_t rank, const char* what) {
  TORCH_CHECK(registered_, "roce: window on rank ", rank_, ": ", what, " before tensor_register()");
  const std::string failed = shared_->failure();
  TORCH_CHECK(failed.empty(), "roce: window on rank ", rank_, ": ", what, " after the group stopped serving the window: ",
              failed);
  TORCH_CHECK(rank >= 0 && rank < size_, "roce: window on rank ", rank_, ": ", what, " names rank ", rank,
              ", not a rank of this group of ", size_);
  return peers_[static_cast<size_t>(rank)];
}

uint64_t RoceWindow::checkedRange(const Peer& peer, int64_t rank, c10::ScalarType dtype, int64_t elems,
                                  int64_t offset, const char* what) const {
  // The offset counts elements of the target's window, so both sides must
  // mean the same element.
  TORCH_CHECK(dtype == peer.dtype, "roce: window ", what, " on rank ", rank_, ": the tensor is ", dtype, " but rank ",
              rank, "'s window holds ", peer.dtype);
  TORCH_CHECK(offset >= 0, "roce: window ", what, " on rank ", rank_, ": negative offset ", offset);
  const uint64_t elem = c10::elementSize(dtype);
  const uint64_t limit = peer.bytes / elem;
  TORCH_CHECK(static_cast<uint64_t>(offset) <= limit && static_cast<uint64_t>(elems) <= limit - offset,
              "roce: window ", what, " on rank ", rank_, ": ", elems, " elements at element ", offset,
              " reach past rank ", rank, "'s window of ", limit, " elements");
  return static_cast<uint64_t>(offset) * elem;
}

c10::intrusive_ptr<c10d::Work> RoceWindow::put(const at::Tensor& tensor, int64_t dstRank, int64_t targetOffsetNelems,
                                               bool asyncOp, const c10d::PutOptions& opts) {
  std::shared_lock<std::shared_mutex> state(stateMu_);
  Peer& peer = peerFor(dstRank, "put");
  TORCH_CHECK(tensor.device().is_cpu(), "roce: window put on rank ", rank_, ": the source is on ", tensor.device(),
              "; windows move CPU tensors (device windows are not supported yet)");
  const uint64_t offset = checkedRange(peer, dstRank, tensor.scalar_type(), tensor.numel(), targetOffsetNelems, "put");
  // The values the tensor shows: a lazily conjugated or negated view's bits
  // are resolved before its bytes go.
  const at::Tensor src = tensor.resolve_conj().resolve_neg().contiguous();
  const uint64_t bytes = src.nbytes();
  if (peer.mapped) {
    // memmove: a put into this rank's own window may overlap its source.
    if (bytes) std::memmove(peer.board->window() + offset, src.data_ptr(), bytes);
    return doneWork(c10d::OpType::SEND, rank_, "window put");
  }
  WindowOp op;
  op.kind = static_cast<uint32_t>(WindowOpKind::Put);
  op.offset = offset;
  op.bytes = bytes;
  auto work = sendToServed(op, static_cast<int>(dstRank), src, "window put", timeoutOf(opts.timeout), *shared_);
  state.unlock();
  if (!asyncOp) work->wait(kNoTimeout);
  return work;
}

c10::intrusive_ptr<c10d::Work> RoceWindow::get(at::Tensor out, int64_t srcRank, int64_t offsetNelems, bool asyncOp) {
  std::shared_lock<std::shared_mutex> state(stateMu_);
  Peer& peer = peerFor(srcRank, "get");
  TORCH_CHECK(out.device().is_cpu() && out.is_contiguous(), "roce: window get on rank ", rank_,
              ": the destination must be a contiguous CPU tensor");
  TORCH_CHECK(!out.is_conj() && !out.is_neg(), "roce: window get on rank ", rank_,
              ": the destination is a conjugated or negated view; get into a plain tensor (resolve_conj() first)");
  const uint64_t offset = checkedRange(peer, srcRank, out.scalar_type(), out.numel(), offsetNelems, "get");
  const uint64_t bytes = out.nbytes();
  if (peer.mapped) {
    if (bytes) std::memmove(out.data_ptr(), peer.board->window() + offset, bytes);
    return doneWork(c10d::OpType::RECV, rank_, "window get");
  }
  WindowOp op;
  op.kind = static_cast<uint32_t>(WindowOpKind::Get);
  op.offset = offset;
  op.bytes = bytes;
  auto work = sendToServed(op, static_cast<int>(srcRank), out, "window get", backend_->timeout_, *shared_);
  state.unlock();
  if (!asyncOp) work->wait(kNoTimeout);
  return work;
}

c10::intrusive_ptr<c10d::Work> RoceWindow::signal(int64_t peerRank, bool asyncOp, const c10d::SignalOptions& opts) {
  std::shared_lock<std::shared_mutex> state(stateMu_);
  Peer& peer = peerFor(peerRank, "signal");
  if (peer.mapped) {
    peer.board->signalFrom(rank_);
    return doneWork(c10d::OpType::SEND, rank_, "window signal");
  }
  WindowOp op;
  op.kind = static_cast<uint32_t>(WindowOpKind::Signal);
  auto work = sendToServed(op, static_cast<int>(peerRank), at::Tensor(), "window signal", timeoutOf(opts.timeout),
                           *shared_);
  state.unlock();
  if (!asyncOp) work->wait(kNoTimeout);
  return work;
}

c10::intrusive_ptr<c10d::Work> RoceWindow::wait_signal(int64_t peerRank, bool asyncOp,
                                                       const c10d::WaitSignalOptions& opts) {
  std::shared_lock<std::shared_mutex> state(stateMu_);
  peerFor(peerRank, "wait_signal");
  uint32_t ticket;
  {
    std::lock_guard<std::mutex> g(ticketsMu_);
    ticket = ++tickets_[static_cast<size_t>(peerRank)];
  }
  const bool written = exposed_ && !peers_[static_cast<size_t>(peerRank)].mapped;
  auto work = c10::make_intrusive<SignalWaitWork>(shared_, rank_, static_cast<int>(peerRank), ticket,
                                                  timeoutOf(opts.timeout), written);
  state.unlock();
  if (!asyncOp) work->wait(kNoTimeout);
  return work;
}

at::Tensor RoceWindow::map_remote_tensor(int64_t rank) {
  std::shared_lock<std::shared_mutex> state(stateMu_);
  Peer& peer = peerFor(rank, "map_remote_tensor");
  TORCH_CHECK(peer.mapped, "roce: window on rank ", rank_, ": map_remote_tensor(", rank, "): rank ", rank,
              " is on another machine (or ROCE_PG_FORCE_NETWORK=1): only a peer on this machine can be mapped; "
              "use put/signal to reach it");
  auto keep = new std::shared_ptr<ShmSegment>(peer.segment);
  return at::from_blob(
      peer.board->window(), peer.sizes, [keep](void*) { delete keep; },
      at::TensorOptions().dtype(peer.dtype).device(at::kCPU));
}

c10::intrusive_ptr<c10d::Window> RoceBackend::new_window(const std::optional<at::Tensor>& tensor) {
  auto w = c10::make_intrusive<RoceWindow>(c10::intrusive_ptr<RoceBackend>::reclaim_copy(this), ++windows_);
  if (tensor) w->tensor_register(*tensor, /*owning=*/true);
  return w;
}

c10d::WindowAttr RoceWindow::get_attr(int64_t peerRank) {
  std::shared_lock<std::shared_mutex> state(stateMu_);
  peerFor(peerRank, "get_attr");
  // Host memory, written in place by peers and the progress thread: one
  // coherent copy, no synchronization beyond a signal needed.
  return c10d::WindowAttr{c10d::WindowAccessType::UNIFIED};
}

}  // namespace roce::adapter
#endif
