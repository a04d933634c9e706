// Collectives on accelerator tensors (CUDA, ROCm, any PrivateUse1 device),
// through the device-generic c10 API only (c10::impl::VirtualGuardImpl,
// c10::Stream, c10::Event, c10::StreamGuard): no CUDA header, so one source
// serves every device type. The design and its reasons are in
// docs/ACCELERATORS.md; in short:
//
//  caller's thread (constructor, add, start): an event I on the caller's
//    current stream S (the call's issue point); the stream copying to the
//    host waits for I, then the device-to-host copies into pinned buffers are
//    queued on it, in pieces for element-wise collectives, each piece
//    followed by an event. Nothing here waits for the device.
//  progress thread (awaitPiece, copyBack, finish): polls each piece's event
//    (never blocking on the device: ranks may outnumber cores, and deadlines,
//    abort and peer failures must still be noticed), runs the host algorithm
//    on the piece, queues the copies of its results back on the second stream
//    (which waits for I, and for nothing the caller queued after it, just
//    before the first of them), and at the end records the event E that the
//    Work hands to the caller's stream in wait().
//
// Each call thus waits only for the caller's work issued before it: a later
// call's issue point never lands ahead of an earlier call's copies back or
// device reductions, which are queued later, by the progress thread.
//
// Lifetimes: every device tensor a copy touches is recorded with the device's
// caching allocator on the copying stream (recordDataPtrOnStream), and kept
// referenced until finish(), after the last copy was queued; so a caller that
// drops a tensor right after an asynchronous collective cannot see its memory
// reused while a copy stream still reads or writes it.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <cstdint>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pinned_cache.hpp"

namespace roce::comm {
class Communicator;
}
namespace roce::adapter {
using namespace roce::comm;


// Returns once `event` has completed, waiting through the Communicator's wait
// loop (deadline, abort, peer failures): asleep until a host function queued
// on `notifyOn` behind the event wakes it (device_notify.hpp), or, on devices
// without host functions, polling with naps. `notifyOn`: a stream with
// nothing queued that must not be held up (the lane's `notify`), or the
// stream the event was just recorded on. `waitingFor` names what the event
// stands for, for a timeout's message.
void awaitDeviceEvent(const c10::Event& event, const c10::Stream& notifyOn, Communicator& c,
                      const std::function<std::string()>& waitingFor);

// The streams a group copies on for one device: `toHost` carries the copies
// into host memory, `toDevice` the results back. Two streams, so that piece
// k-1's results travel back while piece k+1 is still being copied out (the
// two directions of the link run at once; one stream would serialize them).
// `local` carries the copies an algorithm makes within the rank while it runs
// (GPUDirect: its own block), and `reduce` the device reductions of staged
// pieces (device_reduce.hpp): neither waits for anything (what they read is
// ready when the host runs the algorithm), so neither can be held back by a
// caller's work, nor by the copies of other calls queued on the other two.
// `notify` carries the host functions that wake the progress thread when a
// copy it waits for is done (awaitDeviceEvent).
struct DeviceLane {
  c10::Stream toHost;
  c10::Stream toDevice;
  c10::Stream local;
  c10::Stream reduce;
  c10::Stream notify;
  c10::Device device() const { return toHost.device(); }
};

// The lanes of one group, by device; made on first use (from the device's
// stream pool) and kept for the group's life. Thread-safe.
class DeviceLanes {
 public:
  DeviceLane of(c10::Device device);

 private:
  std::mutex mu_;
  std::vector<DeviceLane> lanes_;
};

// One call's copies between device tensors and host staging buffers.
class DeviceStaging {
 public:
  DeviceStaging(DeviceLane lane, std::shared_ptr<PinnedCache> cache);
  ~DeviceStaging();  // finish() if nobody did (the task was never run)
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  // --- caller's thread, before start() ---------------------------------------
  // A contiguous host buffer of `numel` elements from the group's pinned cache.
  at::Tensor hostBuffer(int64_t numel, at::ScalarType dtype);
  // `host` (contiguous, user's shape) stages `user`: read: copied from the
  // device before the operation; write: copied back after it. `offset`
  // places it in the element range that pieces cut (element-wise
  // collectives: its position in the flat host buffer). A tensor that is not
  // contiguous is copied whole, with the first piece it overlaps (in) or the
  // last (back).
  // rows > 1 (all_gather_into_tensor's output, reduce_scatter_tensor's
  // input: one block per rank): `user` (contiguous) is rows x m, pieces cut
  // every row alike over [offset, offset + m), and `host` (flat) holds the
  // pieces one after another, each as rows x its count: piece k's host part
  // sees its rows contiguous, where the algorithms want them. Copied row by
  // row (copies, no kernel). With one piece that is user's own layout.
  void add(const at::Tensor& user, const at::Tensor& host, bool read, bool write, int64_t offset = 0,
           int64_t rows = 1);
  // GPUDirect RDMA: `user` (contiguous) goes to the transport itself, no
  // copy. The call then runs as one piece, which waits for the caller's
  // stream (the NIC must not read before the producers finished); held until
  // finish() (the transport's registration holds device memory weakly).
  void addDirect(const at::Tensor& user);
  const std::vector<at::Tensor>& directTensors() const { return direct_; }
  // GPUDirect RDMA for what cannot go as it is (a list of tensors, a
  // non-contiguous one): a contiguous buffer of `numel` elements on the
  // device, handed to the transport like addDirect's; add() it as the `host`
  // of the user's tensors, and the copies in and back are device-to-device
  // copies on the copy streams (start() then waits for those going in).
  at::Tensor deviceBuffer(int64_t numel, at::ScalarType dtype);
  // Queues the copies to the host. pieceElems > 0: pieces of that many
  // elements over [0, totalElems) (at least one); 0: one piece, everything.
  void start(int64_t pieceElems, int64_t totalElems);

  // --- progress thread -------------------------------------------------------
  size_t pieces() const { return pieces_.size(); }
  int64_t pieceFirst(size_t k) const { return pieces_[k].first; }
  int64_t pieceCount(size_t k) const { return pieces_[k].count; }
  // True once piece k's copies to the host are done (no copy: at once).
  bool ready(size_t k) const;
  // Waits for ready(k) through the Communicator's wait loop (deadline, abort,
  // peer failures), sleeping briefly between polls.
  void awaitPiece(size_t k, Communicator& c);
  // Queues the copies of piece k's results back to the device.
  void copyBack(size_t k);
  // Runs `queue` with the results stream current, after the call's issue
  // point, for results whose size only the end of the call tells (a sparse
  // sum), which copyBack() cannot write; finish() covers what it queued.
  void queueOnResults(const std::function<void()>& queue);
  // An algorithm's copy within this rank between device buffers of the call
  // (its own block: Communicator::copyLocal): queued on the lane's `local` stream
  // and waited for through the Communicator's wait loop before returning, as
  // the transport may send the block next. `dst` and `src` must lie in
  // tensors handed to the transport (addDirect, deviceBuffer).
  void copyOnDevice(void* dst, const void* src, size_t bytes, Communicator& c);
  // Records the end event E (after every copy of the call, on both streams),
  // returns the host buffers to the cache for reuse after E and drops the
  // tensors. Idempotent; returns E.
  std::shared_ptr<c10::Event> finish();

  // The stream the results arrive on (the Work completes its future there).
  c10::Stream resultStream() const { return lane_.toDevice; }
  // The stream device reductions of this call run on (finish() then covers it).
  c10::Stream reduceStream() {
    usedReduce_ = true;
    return lane_.reduce;
  }
  c10::Device device() const { return lane_.device(); }
  // The host buffers, for zero-copy transports (BufferOwner).
  const std::vector<at::Tensor>& hostTensors() const { return hostTensors_; }

 private:
  struct Segment {
    at::Tensor user, host;
    bool read, write;
    int64_t offset;
    int64_t rows;           // blocks cut alike by the pieces (add())
    bool divisible;        // contiguous: copied piece by piece
    bool copiedIn = false;  // whole copies: done already
  };
  struct Piece {
    int64_t first, count;
    std::shared_ptr<c10::Event> ready;  // null: nothing to wait for
  };
  // Queues the copies of `s` that piece `p` covers, in the direction given;
  // returns whether it queued any.
  bool copy(Segment& s, const Piece& p, bool toHost, bool lastPiece);

  DeviceLane lane_;
  std::shared_ptr<PinnedCache> cache_;
  std::vector<PinnedCache::BlockPtr> blocks_;
  std::vector<at::Tensor> hostTensors_;
  std::vector<Segment> segments_;
  std::vector<Piece> pieces_;
  std::shared_ptr<c10::Event> end_;
  std::shared_ptr<c10::Event> issued_;  // I: on the caller's stream at the call
  bool resultsWaitedForIssue_ = false;  // toDevice waits for I (once, just before its first copy)
  // Makes toDevice wait for I, once, unless I has completed already (a wait
  // queued there would hold back the copies back of calls still running).
  void resultsAfterIssue();
  std::shared_ptr<c10::Event> copiedOut_;  // on toHost after the call's copies out (start())
  bool usedReduce_ = false, usedLocal_ = false;  // streams finish() must cover
  std::vector<at::Tensor> direct_;
  // The direct tensor holding [p, p + bytes) as a flat view of it, or undefined.
  at::Tensor directSpan(const void* p, size_t bytes) const;
};

}  // namespace roce::adapter
