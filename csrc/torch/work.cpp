#include "work.hpp"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include "../comm/communicator.hpp"
#include "../common/error.hpp"

namespace roce {
namespace {

std::vector<c10::Device> cudaDevicesOf(const std::vector<at::Tensor>& ts) {
  std::vector<c10::Device> out;
  for (const auto& t : ts)
    if (t.defined() && t.is_cuda() && std::find(out.begin(), out.end(), t.device()) == out.end())
      out.push_back(t.device());
  return out;
}

// The allocation a staged host tensor lives in, for zero-copy transports: a
// reference to its c10::Storage keeps the memory from being freed (and its
// address reused) while a transport holds a registration of it.
// Only for buffers large enough for zero copy (minBytes; 0: zero copy off):
// small operations, the latency-bound ones, allocate nothing for it.
BufferOwner ownerOf(const at::Tensor& host, size_t minBytes) {
  if (minBytes == 0 || !host.defined() || !host.has_storage() || !host.is_cpu() || host.nbytes() < minBytes) return {};
  const c10::Storage& st = host.storage();
  if (!st.data() || st.nbytes() == 0) return {};
  auto keep = std::make_shared<c10::Storage>(st);
  BufferOwner o;
  o.id = st.unsafeGetStorageImpl();
  o.base = static_cast<char*>(const_cast<void*>(st.data()));
  o.len = st.nbytes();
  o.keep = std::move(keep);
  o.released = [](const void* k) { return static_cast<const c10::Storage*>(k)->use_count() == 1; };
  return o;
}

}  // namespace

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
  future_ = c10::make_intrusive<c10::ivalue::Future>(kTensorList, cudaDevicesOf(outputs_));
}

void RoceWork::complete(std::exception_ptr error) {
  if (error) {
    error = toTorchError(error);
    future_->setError(error);
    finish(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
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

bool CollectiveTask::start(Communicator& c) {
  std::vector<BufferOwner> owners;
  for (const auto& s : outputs_)
    if (BufferOwner o = ownerOf(s.host, c.config().ibZeroCopyMinBytes)) owners.push_back(std::move(o));
  {
    auto scope = c.useBufferOwners(std::move(owners));
    body_(c);
  }
  for (const auto& s : outputs_) s.finish();
  return true;
}

void CollectiveTask::complete(std::exception_ptr error) { work_->complete(error); }

PointToPointTask::PointToPointTask(c10::intrusive_ptr<RoceWork> work, std::string what, Staged buffer,
                                   Request::Kind kind, int peer, uint64_t tag)
    : work_(std::move(work)), what_(std::move(what)), buffer_(std::move(buffer)) {
  req_.kind = kind;
  req_.peer = peer;
  req_.tag = tag;
  req_.buf = buffer_.data();
  req_.len = buffer_.bytes();
}

bool PointToPointTask::start(Communicator& c) {
  req_.owner = ownerOf(buffer_.host, c.config().ibZeroCopyMinBytes);
  if (req_.peer < 0) c.postRecvAnySource(req_);
  else c.post(req_);
  return poll(c);
}

bool PointToPointTask::poll(Communicator&) {
  if (!req_.done) return false;
  if (req_.failed()) throwComm(str(what_, " failed: ", req_.error));
  if (req_.kind == Request::Kind::Recv) {
    work_->setSourceRank(req_.peer);
    buffer_.finish();
  }
  return true;
}

void PointToPointTask::complete(std::exception_ptr error) { work_->complete(error); }

}  // namespace roce
