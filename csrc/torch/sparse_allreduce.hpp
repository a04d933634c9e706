// all_reduce(SUM) of a sparse COO tensor, from the dense allgather the
// algorithms already have: every rank gathers every rank's indices and values
// and adds them up itself, as Gloo does. The traffic grows with the number of
// ranks times the largest nnz, which suits sparse gradients (embeddings) whose
// nnz is small next to the dense size.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

namespace roce::comm {
class Communicator;
}
namespace roce::adapter {
using namespace roce::comm;

class DeviceStaging;

// On the caller's thread: rejects what the reduction cannot do (not SUM, not
// COO, more dimensions than the metadata exchange carries) before any traffic.
void checkSparseAllreduce(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);

// On the progress thread: the coalesced sum over the group of `mine` (a CPU
// sparse tensor), on the CPU. Ranks whose tensors differ in size,
// sparse/dense split or dtype all raise, naming the first rank that differs.
at::Tensor sparseAllreduceSum(Communicator& c, const at::Tensor& mine);

// On the progress thread, for a device tensor `t` whose indices and values
// `staging` copied to the host (`indices`, `values`): the sum over the group,
// queued back into `t` on the call's results stream from pinned memory (so
// this thread never waits for the device), with `caller` (the caller's
// stream at the call) recorded on the memory it gets.
void sparseAllreduceSumOnDevice(Communicator& c, const at::Tensor& t, const at::Tensor& indices,
                                const at::Tensor& values, DeviceStaging& staging, c10::Stream caller);

}  // namespace roce::adapter
