#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "device_staging.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <cstdint>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "../common/log.hpp"
#include "device_notify.hpp"

namespace roce::adapter {
using namespace roce::comm;

DeviceLane DeviceLanes::of(c10::Device device) {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& l : lanes_)
    if (l.device() == device) return l;
  // Pool streams, as ProcessGroupGloo's device path and c10::ivalue::Future
  // use: created once per device and process, shared round robin.
  c10::impl::VirtualGuardImpl impl(device.type());
  lanes_.push_back(DeviceLane{impl.getStreamFromGlobalPool(device), impl.getStreamFromGlobalPool(device),
                              impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true),
                              impl.getStreamFromGlobalPool(device), impl.getStreamFromGlobalPool(device)});
  return lanes_.back();
}

DeviceStaging::DeviceStaging(DeviceLane lane, std::shared_ptr<PinnedCache> cache)
    : lane_(lane), cache_(std::move(cache)) {
  // Everything queued on the caller's stream so far (the kernels producing
  // the inputs, earlier readers of the outputs) comes before our copies; the
  // copy streams wait for this point just before their first copy of the
  // call (start(), copyBack()), not now: the stream that copies back must not
  // carry this wait ahead of the copies back of calls issued earlier.
  const c10::Device device = lane_.device();
  c10::impl::VirtualGuardImpl impl(device.type());
  issued_ = std::make_shared<c10::Event>(device.type());
  issued_->record(impl.getStream(device));
}

void DeviceStaging::resultsAfterIssue() {
  if (resultsWaitedForIssue_) return;
  if (!issued_->query()) issued_->block(lane_.toDevice);
  resultsWaitedForIssue_ = true;
}

void DeviceStaging::addDirect(const at::Tensor& user) {
  if (user.numel() > 0) direct_.push_back(user);
}

at::Tensor DeviceStaging::deviceBuffer(int64_t numel, at::ScalarType dtype) {
  // Allocated on the caller's stream by the caching allocator and recorded
  // on the copy streams that fill and drain it, so that its memory is not
  // reused before their copies ran once finish() drops it (the transport's
  // registration holds device memory weakly).
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype).device(lane_.device()));
  c10::impl::VirtualGuardImpl impl(lane_.device().type());
  impl.recordDataPtrOnStream(t.storage().data_ptr(), lane_.toHost);
  impl.recordDataPtrOnStream(t.storage().data_ptr(), lane_.toDevice);
  // Freed memory is reusable on its stream at once: the block may still have
  // work of its previous owner (a device's poisoning, a kernel) queued on the
  // caller's stream after the event the constructor recorded. The copy
  // streams, and the NIC through the piece's readiness (start()), wait for
  // the caller's stream as of here instead.
  issued_ = std::make_shared<c10::Event>(lane_.device().type());
  issued_->record(impl.getStream(lane_.device()));
  addDirect(t);
  return t;
}

at::Tensor DeviceStaging::directSpan(const void* p, size_t bytes) const {
  auto* b = static_cast<const char*>(p);
  for (const at::Tensor& t : direct_) {
    auto* base = static_cast<const char*>(t.data_ptr());
    const size_t len = t.nbytes(), esz = t.element_size();
    if (b < base || b + bytes > base + len) continue;
    const size_t at = static_cast<size_t>(b - base);
    if (at % esz || bytes % esz)
      throw std::logic_error(str("roce: a device copy of ", bytes, " bytes at offset ", at,
                                 " is not whole elements of ", esz, " bytes"));
    return t.view(-1).narrow(0, static_cast<int64_t>(at / esz), static_cast<int64_t>(bytes / esz));
  }
  return at::Tensor();
}

void DeviceStaging::copyOnDevice(void* dst, const void* src, size_t bytes, Communicator& c) {
  at::Tensor to = directSpan(dst, bytes), from = directSpan(src, bytes);
  if (!to.defined() || !from.defined())
    throw std::logic_error("roce: a copy within the rank touches device memory outside the call's tensors");
  {
    at::NoGradGuard noGrad;
    c10::StreamGuard guard(lane_.local);
    to.copy_(from, /*non_blocking=*/true);
  }
  Counters::add(c.counters().deviceBytesLocal, bytes);
  usedLocal_ = true;
  c10::Event copied(lane_.device().type());
  copied.record(lane_.local);
  awaitDeviceEvent(copied, lane_.local, c, [&] {
    return str("the copy of this rank's own block (", bytes, " bytes) on ", lane_.device().str());
  });
}

DeviceStaging::~DeviceStaging() {
  if (end_ || (blocks_.empty() && segments_.empty() && direct_.empty())) return;
  try {
    finish();
  } catch (const std::exception& e) {
    ROCE_WARN("roce: releasing the staging buffers of a device operation failed: ", e.what());
  }
}

at::Tensor DeviceStaging::hostBuffer(int64_t numel, at::ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (bytes == 0) return at::empty({numel}, at::TensorOptions().dtype(dtype));
  blocks_.push_back(cache_->acquire(bytes, lane_.device()));
  at::Tensor t = PinnedCache::view(blocks_.back(), numel, dtype);
  hostTensors_.push_back(t);
  return t;
}

void DeviceStaging::add(const at::Tensor& user, const at::Tensor& host, bool read, bool write, int64_t offset,
                        int64_t rows) {
  if (user.numel() == 0 || !(read || write)) return;
  if (rows < 1 || user.numel() % rows != 0 || (rows > 1 && offset != 0))
    throw std::logic_error(str("roce: staging ", user.numel(), " elements as ", rows, " rows at offset ", offset));
  // The caching allocator must not hand this memory to anyone else before the
  // copy streams are done with it, even if the caller frees the tensor now.
  c10::impl::VirtualGuardImpl impl(lane_.device().type());
  const c10::DataPtr& data = user.storage().data_ptr();
  if (read) impl.recordDataPtrOnStream(data, lane_.toHost);
  if (write) impl.recordDataPtrOnStream(data, lane_.toDevice);
  segments_.push_back(Segment{user, host, read, write, offset, rows, user.is_contiguous()});
}

void DeviceStaging::start(int64_t pieceElems, int64_t totalElems) {
  // Called at the issue, on the caller's thread: the copies to the host
  // queued below follow this call's issue point, and precede the next call's.
  issued_->block(lane_.toHost);
  // Marks the end of this call's copies out on toHost, also when queuing
  // them failed part way (finish() covers whatever was queued).
  struct MarkCopiedOut {
    DeviceStaging& s;
    ~MarkCopiedOut() {
      try {
        s.copiedOut_ = std::make_shared<c10::Event>(s.lane_.device().type());
        s.copiedOut_->record(s.lane_.toHost);
      } catch (const std::exception& e) {
        s.copiedOut_.reset();
        ROCE_WARN("roce: recording the end of a call's copies to the host failed: ", e.what());
      }
    }
  } markCopiedOut{*this};
  if (!direct_.empty()) {
    // One piece: the transport reads once the producers are done, or once the
    // copies into device buffers (deviceBuffer) that follow them are.
    pieces_.push_back(Piece{0, totalElems, issued_});
    at::NoGradGuard noGrad;
    c10::StreamGuard guard(lane_.toHost);
    bool queued = false;
    for (auto& s : segments_)
      if (s.read) queued = copy(s, pieces_[0], /*toHost=*/true, /*lastPiece=*/true) || queued;
    if (queued) {
      pieces_[0].ready = std::make_shared<c10::Event>(lane_.device().type());
      pieces_[0].ready->record(lane_.toHost);
    }
    return;
  }
  if (pieceElems <= 0) {
    pieces_.push_back(Piece{0, totalElems, nullptr});
  } else {
    const int64_t n = std::max<int64_t>(1, (totalElems + pieceElems - 1) / pieceElems);
    for (int64_t k = 0; k < n; ++k)
      pieces_.push_back(Piece{k * pieceElems, std::min(pieceElems, totalElems - k * pieceElems), nullptr});
  }
  at::NoGradGuard noGrad;
  c10::StreamGuard guard(lane_.toHost);
  for (size_t k = 0; k < pieces_.size(); ++k) {
    bool queued = false;
    for (auto& s : segments_)
      if (s.read) queued = copy(s, pieces_[k], /*toHost=*/true, k + 1 == pieces_.size()) || queued;
    if (queued) {
      pieces_[k].ready = std::make_shared<c10::Event>(lane_.device().type());
      pieces_[k].ready->record(lane_.toHost);
    }
  }
}

bool DeviceStaging::copy(Segment& s, const Piece& p, bool toHost, bool lastPiece) {
  const int64_t rowElems = s.user.numel() / s.rows;
  const int64_t end = s.offset + rowElems;
  const int64_t pieceEnd = p.first + p.count;
  if (!s.divisible || pieces_.size() == 1) {
    // Piece-major rows are the user's layout only when there is one piece.
    if (s.rows > 1 && pieces_.size() > 1)
      throw std::logic_error("roce: a non-contiguous tensor staged as rows cannot be cut into pieces");
    // Whole: in with the first piece it overlaps, back with the one holding
    // its last element (the earlier ones are done by then).
    const at::Tensor host = s.host.view(s.user.sizes());
    if (toHost) {
      if (s.copiedIn || !(pieces_.size() == 1 || (p.first < end && s.offset < pieceEnd))) return false;
      s.copiedIn = true;
      host.copy_(s.user, /*non_blocking=*/true);
    } else {
      if (!(pieces_.size() == 1 || lastPiece || (p.first < end && end <= pieceEnd))) return false;
      s.user.copy_(host, /*non_blocking=*/true);
    }
    return true;
  }
  const int64_t lo = std::max(p.first, s.offset), hi = std::min(pieceEnd, end);
  if (lo >= hi) return false;
  const at::Tensor userRows = s.user.view({s.rows, rowElems});
  const at::Tensor hostRows = s.host.view(-1).narrow(0, s.rows * (lo - s.offset), s.rows * (hi - lo)).view({s.rows, hi - lo});
  for (int64_t r = 0; r < s.rows; ++r) {
    at::Tensor dev = userRows[r].narrow(0, lo - s.offset, hi - lo);
    at::Tensor host = hostRows[r];
    if (toHost) host.copy_(dev, /*non_blocking=*/true);
    else dev.copy_(host, /*non_blocking=*/true);
  }
  return true;
}

bool DeviceStaging::ready(size_t k) const { return !pieces_[k].ready || pieces_[k].ready->query(); }

void awaitDeviceEvent(const c10::Event& event, const c10::Stream& notifyOn, Communicator& c,
                      const std::function<std::string()>& waitingFor) {
  if (event.query()) return;
  if (auto notice = DeviceNotice::arm(event, notifyOn)) {
    // The wait loop's own blocking wait (transports, abort, deadline) also
    // wakes on the notice.
    Counters::add(c.counters().deviceWaitsNotified, 1);
    const Communicator::WakeOnFd wakeOn(c, notice->fd());
    c.waitUntil([&] { return notice->fired() || event.query(); }, waitingFor);
    return;
  }
  // No host functions: poll, sleeping a little longer each time (20 us to
  // 0.5 ms), which costs no core that another rank on this machine needs and
  // adds at most 0.5 ms to a long copy.
  auto nap = std::chrono::microseconds(20);
  c.waitUntil([&] { return event.query(); }, waitingFor,
              [&] {
                Counters::add(c.counters().deviceWaitNaps, 1);
                std::this_thread::sleep_for(nap);
                nap = std::min(nap * 2, std::chrono::microseconds(500));
              });
}

void DeviceStaging::awaitPiece(size_t k, Communicator& c) {
  if (!pieces_[k].ready) return;
  awaitDeviceEvent(*pieces_[k].ready, lane_.notify, c, [&] {
    return str("the copy of piece ", k + 1, " of ", pieces_.size(), " from ", lane_.device().str(),
               " to host memory, which follows the kernels queued on the caller's stream before the collective");
  });
}

void DeviceStaging::copyBack(size_t k) {
  resultsAfterIssue();  // earlier readers of the outputs on the caller's stream
  at::NoGradGuard noGrad;
  c10::StreamGuard guard(lane_.toDevice);
  for (auto& s : segments_)
    if (s.write) copy(s, pieces_[k], /*toHost=*/false, k + 1 == pieces_.size());
}

void DeviceStaging::queueOnResults(const std::function<void()>& queue) {
  resultsAfterIssue();
  at::NoGradGuard noGrad;
  c10::StreamGuard guard(lane_.toDevice);
  queue();
}

std::shared_ptr<c10::Event> DeviceStaging::finish() {
  if (end_) return end_;
  const c10::DeviceType type = lane_.device().type();
  // E on the results' stream, after the call's copies to the host and any
  // device reduction or local copy of it (the pinned blocks are reused after
  // E): on success the host saw those finish already, but a failed or
  // aborted operation may end with some still queued. The copies out as of
  // the end of start(), not toHost as it is now: later calls have queued
  // their waits on it since. The copies back already follow the call's issue
  // point; copies out, reductions and local copies wait for nothing of the
  // caller queued after it.
  if (copiedOut_) copiedOut_->block(lane_.toDevice);
  for (auto [used, stream] : {std::pair{usedReduce_, lane_.reduce}, std::pair{usedLocal_, lane_.local}}) {
    if (!used) continue;
    c10::Event done(type);
    done.record(stream);
    done.block(lane_.toDevice);
  }
  auto end = std::make_shared<c10::Event>(type);
  end->record(lane_.toDevice);
  end_ = end;
  cache_->release(blocks_, end_);
  blocks_.clear();
  // Dropping the tensors now is safe: their memory was recorded on the
  // streams that still use it (add()).
  segments_.clear();
  hostTensors_.clear();
  direct_.clear();
  return end_;
}

}  // namespace roce::adapter
