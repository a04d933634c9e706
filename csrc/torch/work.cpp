#include <roce_torch_headers.hpp>  // first: a precompiled header (setup.py)
#include "work.hpp"

#include <ATen/core/jit_type.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <cstdint>

#include <optional>

#include "../comm/communicator.hpp"
#include "../common/error.hpp"
#include "../common/log.hpp"
#include "device_capture.hpp"
#include "device_guard.hpp"

namespace roce::adapter {
using namespace roce::comm;

namespace {

// The devices (not the CPU) the future's value lives on.
std::vector<c10::Device> devicesOf(const std::vector<at::Tensor>& ts) {
  std::vector<c10::Device> out;
  for (const auto& t : ts)
    if (t.defined() && !t.is_cpu() && std::find(out.begin(), out.end(), t.device()) == out.end())
      out.push_back(t.device());
  return out;
}

// A staged host tensor's, only for buffers large enough for zero copy
// (minBytes; 0: zero copy off): small operations, the latency-bound ones,
// allocate nothing for it.
BufferOwner ownerOf(const at::Tensor& host, size_t minBytes) {
  if (minBytes == 0 || !host.defined() || !host.has_storage() || !host.is_cpu() || host.nbytes() < minBytes) return {};
  return storageOwner(host);
}

// A device tensor handed to the transport itself (GPUDirect): always owned,
// whatever its size (the transport must register it), and counted. Unlike a
// host buffer, its registration holds the storage weakly: once the user (and
// the Work) drop the tensor, its memory goes back to the device's caching
// allocator at once, instead of staying allocated (up to
// ROCE_PG_IB_DEVICE_REG_BYTES per group) until the cache next looks. Why that
// is safe: the weak reference keeps the StorageImpl object, the cache's key,
// from being reused, so an entry whose storage died never matches a lookup
// again and is only deregistered; a live entry is reused only with the same
// memory (base, length and the allocation's buffer id); and the call's task
// holds its tensors until every transfer is done, or until a failure has put
// the peers' queue pairs in the error state (the group breaks first), so the
// NIC never reaches memory the tensor gave up.
BufferOwner directOwner(const at::Tensor& t, const CallStaging& st, Communicator& c) {
  Counters::add(c.counters().deviceBytesDirect, t.nbytes());
  BufferOwner o = storageOwner(t);
  o.exportDmabuf = st.exportDmabuf;
  o.deviceIndex = t.device().has_index() ? t.device().index() : 0;
  if (st.bufferId && o) o.bufferId = st.bufferId(o.base, o.deviceIndex);
  return o;
}

// The device of a call's device tensors, for DeviceStepGuard; none for CPU
// tensors. A call without device staging may still have device tensors (a
// sparse allreduce converts them on the progress thread).
std::optional<c10::Device> deviceOf(const CallStaging& staging, const RoceWork& work) {
  if (staging.device) return staging.device->device();
  for (const auto& t : work.outputs())
    if (t.defined() && !t.is_cpu()) return t.device();
  return std::nullopt;
}

void countStaged(const DeviceStaging& d, Communicator& c) {
  size_t n = 0;
  for (const auto& h : d.hostTensors()) n += h.nbytes();
  Counters::add(c.counters().deviceBytesStaged, n);
}

}  // namespace

// The allocation a tensor lives in, for zero-copy transports. Host memory: a
// reference to its c10::Storage keeps the memory from being freed (and its
// address reused) while a transport holds a registration of it. Device
// memory is held weakly (directOwner says why).
BufferOwner storageOwner(const at::Tensor& t) {
  const c10::Storage& st = t.storage();
  if (!st.data() || st.nbytes() == 0) return {};
  BufferOwner o;
  o.id = st.unsafeGetStorageImpl();
  o.base = static_cast<char*>(const_cast<void*>(st.data()));
  o.len = st.nbytes();
  o.device = !t.is_cpu();
  if (o.device) {  // see directOwner
    using Weak = c10::weak_intrusive_ptr<c10::StorageImpl>;
    o.keep = std::make_shared<Weak>(st.getWeakStorageImpl());
    o.released = [](const void* k) { return static_cast<const Weak*>(k)->expired(); };
  } else {
    o.keep = std::make_shared<c10::Storage>(st);
    o.released = [](const void* k) { return static_cast<const c10::Storage*>(k)->use_count() == 1; };
  }
  return o;
}

std::exception_ptr toTorchError(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error&) {
    return e;
  } catch (const std::exception& err) {
    try {
      C10_THROW_ERROR(DistBackendError, err.what());
    } catch (...) {
      return std::current_exception();
    }
  }
  return e;
}

RoceWork::RoceWork(c10d::OpType type, int rank, const char* title, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, title), outputs_(std::move(outputs)), rank_(rank), title_(title) {
  // The type is the same for every Work: built once, not per operation.
  static const c10::TypePtr kTensorList = c10::ListType::create(c10::TensorType::get());
  future_ = c10::make_intrusive<c10::ivalue::Future>(kTensorList, devicesOf(outputs_));
}

void RoceWork::complete(std::exception_ptr error) {
  if (error) {
    error = toTorchError(error);
    future_->setError(error);
    finish(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
    // After finish(): torch's post-hook maps this Work's key and then asks
    // isCompleted(), so a completion it misses here it sees there.
    if (hooks_) hooks_->fire(seq_, durationMs());
  }
  std::vector<Done> waiting;
  {
    std::lock_guard<std::mutex> g(doneMu_);
    done_ = true;
    doneError_ = error;
    waiting.swap(whenDone_);
  }
  for (auto& done : waiting) {
    try {
      done(error, endEvent());
    } catch (const std::exception& e) {
      ROCE_WARN("roce: rank ", rank_, ": a completion callback of ", title_, " raised: ", e.what());
    }
  }
}

void RoceWork::whenComplete(Done done) {
  {
    std::lock_guard<std::mutex> g(doneMu_);
    if (!done_) {
      whenDone_.push_back(std::move(done));
      return;
    }
  }
  done(doneError_, endEvent());
}

std::optional<float> RoceWork::durationMs() const {
  const int64_t start = startNs_.load(std::memory_order_relaxed), end = endNs_.load(std::memory_order_relaxed);
  if (start == 0 || end < start) return std::nullopt;
  return static_cast<float>(end - start) / 1e6f;
}

float RoceWork::getDuration() const {
  auto ms = durationMs();
  TORCH_CHECK(ms.has_value(), "roce: getDuration(): ", title_, " has not ended yet");
  return *ms;
}

void RoceWork::completeOnDevice(std::exception_ptr error, std::shared_ptr<c10::Event> end, c10::Stream results) {
  {
    std::lock_guard<std::mutex> g(endMu_);
    end_ = std::move(end);
  }
  c10::StreamGuard onResults(results);
  complete(error);
}

std::shared_ptr<c10::Event> RoceWork::endEvent() const {
  std::lock_guard<std::mutex> g(endMu_);
  return end_;
}

void RoceWork::synchronize() {
  if (auto end = endEvent()) {
    // A capturing stream cannot wait for work that is not in its graph.
    refuseCapture(end->device(), rank_, "wait() or synchronize() on a Work was called");
    c10::impl::VirtualGuardImpl impl(end->device_type());
    end->block(impl.getStream(end->device()));
  }
}

bool RoceWork::isCompleted() {
  if (!c10d::Work::isCompleted()) return false;
  auto end = endEvent();
  return !end || end->query();
}

bool RoceWork::wait(std::chrono::milliseconds timeout) {
  if (timeout != kNoTimeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return completed_; }))
      C10_THROW_ERROR(DistBackendError,
                      c10::str("roce: ", title_, " on rank ", rank_, " did not complete within wait(timeout=",
                               timeout.count(), " ms); it is still running and may complete later"));
  }
  return c10d::Work::wait(kNoTimeout);
}

int RoceWork::sourceRank() const {
  TORCH_CHECK(sourceRank_ >= 0, "roce: sourceRank() is only known for a completed recv from any source");
  return sourceRank_;
}

std::string OpLabel::text() const { return str(title, " #", seq, " (", bytes, " bytes)"); }

void completeWork(RoceWork& work, Task& task, CallStaging& staging, std::exception_ptr error) {
  task.timeoutExtension.release();  // the extensions this operation was the first after expire with it
  // A device that cannot be selected (a sticky device error) fails the Work
  // rather than leave it never completed.
  std::optional<DeviceStepGuard> onDevice;
  try {
    onDevice.emplace(deviceOf(staging, work));
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  work.setTimes(task.startNs, task.endNs);
  if (!staging.device) {
    work.complete(error);
    return;
  }
  std::shared_ptr<c10::Event> end;
  try {
    end = staging.device->finish();
  } catch (...) {
    if (!error) error = std::current_exception();  // a device error: report it rather than hang a waiter
  }
  if (end) work.completeOnDevice(error, std::move(end), staging.device->resultStream());
  else work.complete(error);
}

bool CollectiveTask::start(Communicator& c) {
  std::vector<BufferOwner> owners;
  auto own = [&](const at::Tensor& host) {
    if (BufferOwner o = ownerOf(host, c.config().verbs.zeroCopyMinBytes)) owners.push_back(std::move(o));
  };
  const DeviceStepGuard onDevice(deviceOf(staging_, *work_));
  DeviceStaging* device = staging_.device.get();
  if (device) {
    for (const auto& h : device->hostTensors()) own(h);
    for (const auto& t : device->directTensors()) owners.push_back(directOwner(t, staging_, c));
    countStaged(*device, c);
  } else {
    for (const auto& s : staging_.cpuOutputs) own(s.host);
  }
  {
    Communicator::DeviceCopy deviceCopy;
    if (device && !device->directTensors().empty())
      deviceCopy = [device, &c](void* dst, const void* src, size_t bytes) { device->copyOnDevice(dst, src, bytes, c); };
    auto scope = c.useBufferOwners(std::move(owners), std::move(deviceCopy));
    if (!device) {
      body_(c, 0, elems_);
    } else {
      // Piece k's host part runs while k+1 is still copied in and k-1's
      // results travel back.
      for (size_t k = 0; k < device->pieces(); ++k) {
        device->awaitPiece(k, c);
        body_(c, device->pieceFirst(k), device->pieceCount(k));
        staging_.flushReceived();  // before any device work may read what the NIC wrote
        device->copyBack(k);
      }
    }
  }
  for (const auto& s : staging_.cpuOutputs) s.finish();
  return true;
}

void CollectiveTask::complete(std::exception_ptr error) { completeWork(*work_, *this, staging_, error); }

PointToPointTask::PointToPointTask(c10::intrusive_ptr<RoceWork> work, std::string what, CallStaging staging,
                                   at::Tensor host, Request::Kind kind, int peer, uint64_t tag)
    : work_(std::move(work)), what_(std::move(what)), staging_(std::move(staging)), host_(std::move(host)) {
  req_.kind = kind;
  req_.peer = peer;
  req_.tag = tag;
  req_.buf = host_.data_ptr();
  req_.len = host_.numel() * host_.element_size();
}

bool PointToPointTask::start(Communicator& c) {
  const DeviceStepGuard onDevice(deviceOf(staging_, *work_));
  if (staging_.direct) {
    if (req_.len > 0) req_.owner = directOwner(host_, staging_, c);  // an empty message touches nothing
  } else {
    req_.owner = ownerOf(host_, c.config().verbs.zeroCopyMinBytes);
    if (staging_.device) countStaged(*staging_.device, c);
  }
  // A send from a device first waits for its copy to the host, as a
  // collective would (an idle engine blocks on descriptors, which a device
  // event does not have, so polling it from poll() could sleep through it).
  if (staging_.device) staging_.device->awaitPiece(0, c);
  if (req_.peer < 0) c.postRecvAnySource(req_);
  else c.post(req_);
  return poll(c);
}

bool PointToPointTask::poll(Communicator&) {
  if (!req_.done) return false;
  const DeviceStepGuard onDevice(deviceOf(staging_, *work_));
  if (req_.failed()) throwComm(str(what_, " failed: ", req_.error));
  if (req_.kind == Request::Kind::Recv) {
    work_->setSourceRank(req_.peer);
    staging_.flushReceived();
    if (staging_.device) staging_.device->copyBack(0);
    for (const auto& s : staging_.cpuOutputs) s.finish();
  }
  return true;
}

void PointToPointTask::complete(std::exception_ptr error) { completeWork(*work_, *this, staging_, error); }

}  // namespace roce::adapter
