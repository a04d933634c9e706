// Turning the tensors a c10d call receives into the contiguous host buffers the
// algorithms work on, and back. CPU contiguous tensors are used in place; CUDA
// or non-contiguous tensors are staged through a contiguous host copy.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

#include "../common/dtype.hpp"

namespace roce {

struct Staged {
  at::Tensor user;  // what the caller passed
  at::Tensor host;  // contiguous CPU tensor the algorithms read / write
  bool copyBack = false;

  void* data() const { return host.data_ptr(); }
  size_t bytes() const { return host.numel() * host.element_size(); }
  // Runs on the progress thread once the operation succeeded.
  void finish() const;
};

// readable: the algorithm reads the current contents (inputs, in-place ops).
Staged stage(const at::Tensor& t, bool readable);

// Argument checks that raise c10::Error naming the operation.
void checkTensor(const at::Tensor& t, const char* op);
void checkSingle(const std::vector<at::Tensor>& ts, const char* op);
void checkSameDeviceAndDtype(const at::Tensor& a, const at::Tensor& b, const char* op);
void checkRank(int64_t r, int size, const char* what, const char* op);

// For reductions: the dtype the kernels know, or an error naming it.
DataType reductionType(const at::Tensor& t, const char* op);
Reduction toReduction(const c10d::ReduceOp& op, DataType t);

}  // namespace roce
