// The reduction of one call, from c10d's ReduceOp. A PREMUL_SUM factor held in
// device memory is not read at the issue: reading it there (.item()) would
// make the caller's thread wait for every kernel queued before the call, the
// kernel producing the factor among them, which is the overlap DDP and FSDP
// issue collectives asynchronously for. It is copied instead to a pinned host
// scalar with the call's first piece, on the stream that copies the inputs
// out (so behind the same kernels), and read by the progress thread, which
// runs a piece only once its copies arrived.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "../common/dtype.hpp"
#include "tensor_staging.hpp"

namespace roce::adapter {

class CallReduction {
 public:
  // Checks that `op` has a meaning for `t`; stages a device factor through
  // st.device (before st's start()). A factor on another device than the
  // call's, or a device factor of a call on CPU tensors, is read at once.
  CallReduction(const c10d::ReduceOp& op, DataType t, CallStaging& st);
  // The same operator and factor, checked for another element type (the
  // tensors of a coalesced call), sharing the staged factor.
  CallReduction forType(DataType t) const;

  // The reduction with its factor. Progress thread: only once the call's
  // first piece is ready (DeviceStaging::awaitPiece), which the tasks do
  // before running a body.
  Reduction get() const;
  // The operator alone (any thread, at any time): the factor may not be known yet.
  ReduceOp op() const { return red_.op; }

 private:
  CallReduction() = default;
  Reduction red_;
  at::Tensor hostFactor_;  // defined: the staged device factor, read by get()
};

}  // namespace roce::adapter
