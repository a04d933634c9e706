// torch's one-sided windows (dist._new_window, c10d::Window) for CPU tensors.
// Registering a tensor moves its storage into shared memory of roce's own
// (the bytes copied once; the tensor and its views keep working), so that
//  * a peer on the same machine maps it: put is a copy straight into the
//    owner's tensor by the caller, signal bumps a count in the owner's board
//    (window_board.hpp), map_remote_tensor is a tensor over the mapping;
//  * a peer on another machine writes its puts straight into the tensor,
//    and reads its gets straight out of it, by RDMA where the network
//    transport exposes it (verbs), with no action of the owner's CPU;
//    signals, and puts and gets over other transports, go through the
//    owner's progress thread (window_service.hpp), with no call of the
//    owner's either.
// A signal guarantees that every put the same rank made to the same peer
// before it is in the peer's memory once wait_signal returns there.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>

#ifdef C10D_BACKEND_HAS_WINDOW
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "../transport/shm/shm_segment.hpp"
#include "../window/window_board.hpp"
#include "../window/window_service.hpp"
#include "../window/window_wire.hpp"

namespace roce::adapter {
using namespace roce::transport::shm;
using namespace roce::window;

class RoceBackend;

// What a registered storage's DataPtr holds: the segment it lives in, and
// whether a window still has it registered (a deregistered one may be
// registered again).
struct WindowMemory {
  std::shared_ptr<ShmSegment> segment;
  std::atomic<bool> registered{true};
};

// What a registration shares with its service task and the Works of its
// waits (any thread).
struct WindowShared {
  std::shared_ptr<ShmSegment> mine;
  // The window's exposure, handed back by its ended service (declared after
  // `mine`: it goes first); released by tensor_deregister on its caller's
  // thread, not on the group's progress thread.
  std::unique_ptr<transport::ExposedMemory> exposure;
  // The order of one-sided writes and reads and messages per peer (progress thread).
  std::shared_ptr<WindowOrder> order;
  WindowBoard* board = nullptr;
  std::mutex mu;
  std::condition_variable ended;
  bool serving = false;  // the service task runs
  // Why operations can no longer complete (the group failed, was aborted,
  // shut down or reconfigured; the service failed): set once, wakes waiters.
  std::string failed;
  void fail(const std::string& why);
  std::string failure();
};

class RoceWindow : public c10d::Window {
 public:
  // Collective over the backend's group; registers `tensor` if given.
  RoceWindow(c10::intrusive_ptr<RoceBackend> backend, uint64_t id);
  // Without tensor_deregister (collective), a registration's service keeps
  // running until the group ends, and peers' deregister waits for this
  // rank's close: warned about.
  ~RoceWindow() override;

  void tensor_register(const at::Tensor& tensor, bool owning) override;
  void tensor_deregister() override;
  c10::intrusive_ptr<c10d::Work> put(const at::Tensor& tensor, int64_t dstRank, int64_t targetOffsetNelems,
                                     bool asyncOp, const c10d::PutOptions& opts) override;
  at::Tensor map_remote_tensor(int64_t rank) override;
  c10::intrusive_ptr<c10d::Work> signal(int64_t peerRank, bool asyncOp, const c10d::SignalOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> wait_signal(int64_t peerRank, bool asyncOp,
                                             const c10d::WaitSignalOptions& opts) override;
  c10d::WindowAttr get_attr(int64_t peerRank) override;
  // roce's own, beside torch's interface (roce_pg.window_get): reads
  // out.numel() elements of srcRank's window from element `offset` into
  // `out`, after every put this rank made to srcRank before it.
  c10::intrusive_ptr<c10d::Work> get(at::Tensor out, int64_t srcRank, int64_t offsetNelems, bool asyncOp);

  // What every rank publishes at registration, fixed-size for one allgather.
  struct Published;
  // Each rank's window as this rank reaches it.
  struct Peer {
    bool mapped = false;                  // on this machine (or this rank): through the mapping
    std::shared_ptr<ShmSegment> segment;  // mapped: the peer's segment
    WindowBoard* board = nullptr;         // mapped: the peer's board
    uint64_t bytes = 0;                   // the peer's window
    c10::ScalarType dtype = c10::ScalarType::Byte;
    std::vector<int64_t> sizes;
    RemoteMemory remote;                  // served: its window exposed for one-sided access (else all zero)
    uint64_t windowAt = 0;                // where its window starts in that memory (its signal counts first)
  };

 private:
  // Throws unless a tensor is registered, the group can still serve it and
  // `rank` is a rank of the group. The caller holds stateMu_ (shared).
  Peer& peerFor(int64_t rank, const char* what);
  std::chrono::milliseconds timeoutOf(std::chrono::milliseconds requested) const;
  void allgather(const void* mine, void* all, size_t each);  // a collective of the group, waited for
  std::vector<uint8_t> agree(bool ok);  // every rank's ok, by allgather
  // `exposure`: this rank's window open to the served peers' one-sided
  // writes and reads, kept by the service until it ends.
  void startService(const std::vector<int>& served, std::unique_ptr<transport::ExposedMemory> exposure);
  // A put's head and bytes (src), or its one-sided write where the peer
  // exposed its window; a signal's, get's or close's head: to a peer on
  // another machine, through the group's engine (after what it has queued),
  // in the order of `shared`'s registration.
  // Issued, not waited for (the caller waits, its state lock released).
  c10::intrusive_ptr<c10d::Work> sendToServed(WindowOp op, int peer, const at::Tensor& buf, const char* title,
                                              std::chrono::milliseconds timeout, const WindowShared& shared);
  // This rank's window exposed to one-sided writes of `served`, or null
  // (warned about when the transport could have but failed).
  std::unique_ptr<transport::ExposedMemory> exposeWindow(const std::vector<int>& served, WindowBoard* board);
  // The byte offset of `elems` elements of `dtype` at element `offset` of
  // rank's window, after checking they fit (what: the call, for errors).
  uint64_t checkedRange(const Peer& peer, int64_t rank, c10::ScalarType dtype, int64_t elems, int64_t offset,
                        const char* what) const;

  c10::intrusive_ptr<RoceBackend> backend_;
  // The registration's state below (registered_, shared_, peers_, served_,
  // memory_, held_): shared while a call issues an operation on it (a
  // mapped peer's copy included), exclusive while tensor_register or
  // tensor_deregister change it, so a call on another thread never uses a
  // registration that is being torn down. Never held while a call waits.
  std::shared_mutex stateMu_;
  uint64_t id_;
  int rank_, size_;
  std::shared_ptr<WindowShared> shared_;
  std::vector<Peer> peers_;
  std::vector<int> served_;  // peers on other machines
  at::Tensor held_;          // the registered tensor, when owning
  std::shared_ptr<WindowMemory> memory_;
  std::mutex ticketsMu_;
  std::vector<uint32_t> tickets_;  // wait_signal calls issued per peer (the count each waits for)
  // Signals issued per peer that writes them by RDMA (the count each writes).
  std::vector<uint32_t> signalsSent_;
  std::mutex signalMu_;  // a written signal's count and its enqueueing
  bool exposed_ = false;  // this rank's window is exposed: served peers write their signal counts
  bool registered_ = false;
  uint64_t tagId_ = 0;  // the registration's tags (window_wire.hpp), drawn alike on every rank
};

}  // namespace roce::adapter
#endif
